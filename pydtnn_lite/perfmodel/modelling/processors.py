"""Which processor a calibration or a traced run measured: its name, vector unit, last cache and generation.

A name alone does not tell two processors apart: a virtual machine reports "AMD EPYC"
for generations with and without AVX-512, and OpenBLAS then runs other GEMM kernels
(SkylakeX against Haswell) at other speeds (on this project's development machine VGG11's
first GEMM took 2.6x as long on the one as on the other). Nor does a vector unit: it
reports "Intel(R) Xeon(R) Processor" with AVX-512 for machines with 260 and with 300 MiB
of last-level cache, whose calibrations timed one-thread GEMMs on every core at once at
146 and at 95 GFLOP/s (2026-11-28, 2026-12-02). Nor do all three: it reports "AMD EPYC"
with AVX-512 and 32 MiB of L3 for a Zen 5 (/proc/cpuinfo family 26, model 2) and a Zen 4
(family 25, model 17), whose OpenBLAS picks other kernels (Haswell and SkylakeX), so the
processor's generation, its family and model, is recorded too. Records written before the
vector unit was recorded name it through the BLAS kernels they list, and before the
processor's cache was, a calibration names it by its CPU machine's last-level cache.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# OpenBLAS's x86 kernels (threadpoolctl's "architecture") by the vector unit they use.
OPENBLAS_VECTOR_UNITS = {"skylakex": "AVX-512", "cooperlake": "AVX-512", "sapphirerapids": "AVX-512",
                         "haswell": "AVX2", "zen": "AVX2", "excavator": "AVX2",
                         "sandybridge": "AVX", "bulldozer": "AVX", "piledriver": "AVX", "steamroller": "AVX"}


def blas_kernels(record: Mapping) -> set[str]:
    """The kernels of the BLAS libraries a calibration's machine record or a trace's meta
    lists (threadpoolctl's "architecture"; none in records written before a trace named
    them). One processor runs OpenBLAS's AVX-512 or its AVX2 kernels as
    ``OPENBLAS_CORETYPE`` says, its GEMMs up to twice as fast with the first (2026-12-02,
    the AMD EPYC with AVX-512: a 2048-cubed float32 product at 412.6 against 222.8 GFLOP/s
    on two threads), so figures measured with other kernels are another machine's."""
    return {str(library.get("architecture")) for library in record.get("blas") or [] if isinstance(library, Mapping)}


@dataclass(frozen=True)
class Processor:
    """A processor's ``name`` (/proc/cpuinfo's model name), ``vector_unit`` ('AVX-512',
    'AVX2', ...), ``cache_bytes``, its last-level cache, and ``generation`` ('family 25
    model 17' on x86), '' and 0 where its record does not say."""

    name: str
    vector_unit: str = ""
    cache_bytes: int = 0
    generation: str = ""

    @classmethod
    def of(cls, record: Mapping) -> Processor:
        """The processor of a calibration's machine record or a trace's meta: its
        ``cpu_model``, ``vector_unit`` (or that of the BLAS kernels it lists) and
        ``cpu_cache_bytes`` (or a CPU calibration's ``last_level_cache_bytes``) and
        ``cpu_generation``."""
        unit = str(record.get("vector_unit") or "")
        if not unit:
            units = {OPENBLAS_VECTOR_UNITS.get(kernels.lower(), "") for kernels in blas_kernels(record)}
            unit = units.pop() if len(units) == 1 else ""
        cache = record.get("cpu_cache_bytes")
        if cache is None and record.get("device", "cpu") == "cpu":
            cache = record.get("last_level_cache_bytes")
        return cls(str(record.get("cpu_model") or ""), unit, int(cache or 0), str(record.get("cpu_generation") or ""))

    def record(self) -> dict[str, str | int]:
        """The entries that name it in a machine record or a trace's meta, as :meth:`of` reads them."""
        return {"cpu_model": self.name, "vector_unit": self.vector_unit, "cpu_cache_bytes": self.cache_bytes,
                "cpu_generation": self.generation}

    def same_vector_unit(self, other: Processor) -> bool:
        """Whether the two have the same name, and the same vector unit where both records name one."""
        return self.name == other.name and (self.vector_unit == other.vector_unit
                                            or not self.vector_unit or not other.vector_unit)

    def same_cache(self, other: Processor) -> bool:
        """Whether the two have the same last-level cache where both records name one."""
        return self.cache_bytes == other.cache_bytes or not self.cache_bytes or not other.cache_bytes

    def same_generation(self, other: Processor) -> bool:
        """Whether the two are of the same generation where both records name one."""
        return self.generation == other.generation or not self.generation or not other.generation

    def same_as(self, other: Processor) -> bool:
        """Whether the two are one kind of processor: :meth:`same_vector_unit`, and the same
        cache and generation where both records name them."""
        return self.same_vector_unit(other) and self.same_cache(other) and self.same_generation(other)

    def differs_from(self, other: Processor) -> bool:
        """Whether both records name their processor and the two are not one kind (:meth:`same_as`)."""
        return bool(self.name and other.name) and not self.same_as(other)

    def __str__(self) -> str:
        cache = f"{self.cache_bytes / 2 ** 20:g} MiB of last-level cache" if self.cache_bytes else ""
        return ", ".join(part for part in (self.name, self.vector_unit, cache, self.generation) if part)
