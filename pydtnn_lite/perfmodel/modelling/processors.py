"""Which processor a calibration or a traced run measured: its name and its widest vector unit.

A name alone does not tell two processors apart: a virtual machine reports "AMD EPYC"
for generations with and without AVX-512, and OpenBLAS then runs other GEMM kernels
(SkylakeX against Haswell) at other speeds (on this project's development machine VGG11's
first GEMM took 2.6x as long on the one as on the other). Records written before the
vector unit was recorded name it through the BLAS kernels they list, where they do.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# OpenBLAS's x86 kernels (threadpoolctl's "architecture") by the vector unit they use.
OPENBLAS_VECTOR_UNITS = {"skylakex": "AVX-512", "cooperlake": "AVX-512", "sapphirerapids": "AVX-512",
                         "haswell": "AVX2", "zen": "AVX2", "excavator": "AVX2",
                         "sandybridge": "AVX", "bulldozer": "AVX", "piledriver": "AVX", "steamroller": "AVX"}


@dataclass(frozen=True)
class Processor:
    """A processor's ``name`` (/proc/cpuinfo's model name) and ``vector_unit`` ('AVX-512',
    'AVX2', ...; '' where its record does not say)."""

    name: str
    vector_unit: str = ""

    @classmethod
    def of(cls, record: Mapping) -> Processor:
        """The processor of a calibration's machine record or a trace's meta: its
        ``cpu_model`` and ``vector_unit``, or the vector unit of the BLAS kernels it lists."""
        unit = str(record.get("vector_unit") or "")
        if not unit:
            units = {OPENBLAS_VECTOR_UNITS.get(str(library.get("architecture", "")).lower(), "")
                     for library in record.get("blas") or [] if isinstance(library, Mapping)}
            unit = units.pop() if len(units) == 1 else ""
        return cls(str(record.get("cpu_model") or ""), unit)

    def record(self) -> dict[str, str]:
        """The entries that name it in a machine record or a trace's meta, as :meth:`of` reads them."""
        return {"cpu_model": self.name, "vector_unit": self.vector_unit}

    def same_as(self, other: Processor) -> bool:
        """Whether the two are one kind of processor: the same name, and the same vector unit
        where both records name one."""
        return self.name == other.name and (self.vector_unit == other.vector_unit
                                            or not self.vector_unit or not other.vector_unit)

    def __str__(self) -> str:
        return f"{self.name}, {self.vector_unit}" if self.vector_unit else self.name
