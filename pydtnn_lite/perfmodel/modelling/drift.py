"""How far the machine moved between a calibration and a run, and the correction it asks for.

Both measure the same machine-state probe (``measuring/machine_state.py``): a one-thread
GEMM rate, a copy rate and a small Allreduce. A kernel's predicted time is scaled by the
ratio of the rate that bounds it, then to now:

- GEMM, by the GEMM rates (compute-bound);
- every other compute kernel, and the time between kernels, by the copy rates
  (memory-bound, or the interpreter's pace, which moves with the memory system and the
  clock alike);
- communication, by the probe's Allreduce time now against the calibration's probe,
  carried over to the run's rank count by the calibration's Allreduce model.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

DRIFT_WARNING = 0.10  # a probe rate that moved more than this makes validate warn

COMPUTE_BOUND = frozenset({"gemm"})


@dataclass(frozen=True)
class MachineState:
    """What the probe measured: FLOP/s of a one-thread float32 GEMM, bytes/s (read and
    written) of a one-thread copy, and the seconds of an Allreduce of ``allreduce_bytes``
    over ``allreduce_ranks`` ranks (None with one rank)."""

    gemm_flops: float
    copy_bytes_per_second: float
    allreduce_ranks: int = 1
    allreduce_bytes: int = 0
    allreduce_seconds: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict) -> MachineState:
        return cls(**record)

    def mean_with(self, other: MachineState) -> MachineState:
        """The mean of two probes of the same job (the rates' and the Allreduce's), e.g. at
        the start and the end of a run: one probe lasts a second, and a shared machine's
        speed moves by tens of percent from one second to the next."""
        seconds = ((self.allreduce_seconds + other.allreduce_seconds) / 2
                   if self.allreduce_seconds and other.allreduce_seconds else None)
        return MachineState((self.gemm_flops + other.gemm_flops) / 2,
                            (self.copy_bytes_per_second + other.copy_bytes_per_second) / 2,
                            self.allreduce_ranks, self.allreduce_bytes, seconds)


@dataclass(frozen=True)
class Drift:
    """Time ratios, now over then, by the kind of work: >1 when the machine runs slower now."""

    compute: float = 1.0
    memory: float = 1.0
    communication: float = 1.0

    def scale(self, kernel: str, communication: bool = False) -> float:
        """The factor for a kernel's predicted time (``communication``: a collective)."""
        if communication:
            return self.communication
        return self.compute if kernel in COMPUTE_BOUND else self.memory

    @property
    def largest(self) -> float:
        """The largest relative move of any of the ratios (0.2: one of them moved by 20 %)."""
        return max(abs(ratio - 1.0) for ratio in (self.compute, self.memory, self.communication))

    @property
    def moved(self) -> bool:
        return self.largest > DRIFT_WARNING

    def describe(self) -> str:
        return (f"GEMM x{self.compute:.3f}, memory x{self.memory:.3f}, communication x{self.communication:.3f} "
                "(time now over time at calibration)")


def drift_between(then: MachineState, now: MachineState,
                  allreduce_model: Callable[[float, int], float] | None = None) -> Drift:
    """The drift from the calibration's probe ``then`` to a run's probe ``now``.

    Communication compares the two probes' Allreduce: directly when they timed the same
    ranks and bytes, otherwise through ``allreduce_model(bytes, ranks)``, the calibration's
    model, which says how much longer the run's Allreduce takes than the calibration's
    on an unmoved machine. Without both probes' Allreduce (or the model, where it is
    needed) communication is taken as unmoved.
    """
    communication = 1.0
    if now.allreduce_seconds and then.allreduce_seconds:
        same = (now.allreduce_ranks, now.allreduce_bytes) == (then.allreduce_ranks, then.allreduce_bytes)
        if same:
            communication = now.allreduce_seconds / then.allreduce_seconds
        elif allreduce_model is not None:
            carried = allreduce_model(now.allreduce_bytes, now.allreduce_ranks) / allreduce_model(
                then.allreduce_bytes, then.allreduce_ranks)
            communication = now.allreduce_seconds / (then.allreduce_seconds * carried)
    return Drift(compute=then.gemm_flops / now.gemm_flops,
                 memory=then.copy_bytes_per_second / now.copy_bytes_per_second,
                 communication=communication)
