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

A probe is itself a measurement on a machine that moves: each records how far its own
figures spread. A ratio is corrected only by the part of its move that lies beyond the
two probes' combined spread (a soft threshold on its logarithm), so noise within a probe's
repeatability leaves a prediction as it is, and a machine that really moved, to another
day's clock or another processor, is still corrected for most of the move.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

DRIFT_WARNING = 0.10  # a probe rate that moved more than this makes validate warn

COMPUTE_BOUND = frozenset({"gemm"})


@dataclass(frozen=True)
class MachineState:
    """What the probe measured: FLOP/s of a one-thread float32 GEMM, bytes/s (read and
    written) of a one-thread copy, and the seconds of an Allreduce of ``allreduce_bytes``
    over ``allreduce_ranks`` ranks (None with one rank).

    The ``*_spread`` fields are each figure's relative uncertainty (0.05: +-5 %), from the
    spread of the probe's repeats and, for a mean of probes, from how far they differ;
    0 where unknown (probes recorded before the spread was)."""

    gemm_flops: float
    copy_bytes_per_second: float
    allreduce_ranks: int = 1
    allreduce_bytes: int = 0
    allreduce_seconds: float | None = None
    gemm_spread: float = 0.0
    copy_spread: float = 0.0
    allreduce_spread: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict) -> MachineState:
        known = {field.name for field in fields(cls)}
        return cls(**{key: value for key, value in record.items() if key in known})

    def mean_with(self, other: MachineState) -> MachineState:
        """The mean of two probes of the same job (the rates' and the Allreduce's), e.g. at
        the start and the end of a run: one probe lasts a second, and a shared machine's
        speed moves by tens of percent from one second to the next. Each spread is the
        larger of the probes' own and half their relative difference."""
        seconds, allreduce_spread = None, 0.0
        if self.allreduce_seconds and other.allreduce_seconds:
            seconds, allreduce_spread = _mean_and_spread(self.allreduce_seconds, other.allreduce_seconds,
                                                         self.allreduce_spread, other.allreduce_spread)
        gemm, gemm_spread = _mean_and_spread(self.gemm_flops, other.gemm_flops, self.gemm_spread, other.gemm_spread)
        copy, copy_spread = _mean_and_spread(self.copy_bytes_per_second, other.copy_bytes_per_second,
                                             self.copy_spread, other.copy_spread)
        return MachineState(gemm, copy, self.allreduce_ranks, self.allreduce_bytes, seconds,
                            gemm_spread, copy_spread, allreduce_spread)


def _mean_and_spread(first: float, second: float, first_spread: float, second_spread: float) -> tuple[float, float]:
    mean = (first + second) / 2
    return mean, max((first_spread + second_spread) / 2, abs(first - second) / (2 * mean))


def beyond_noise(ratio: float, *spreads: float) -> float:
    """``ratio`` with the part of its move that the probes' ``spreads`` (relative, combined
    in quadrature) can explain taken off: 1.0 within the noise, and towards 1 by the noise
    beyond it (a soft threshold on the logarithm, so a ratio and its inverse shrink alike)."""
    noise = math.log1p(math.hypot(*spreads)) if spreads else 0.0
    move = math.log(ratio)
    return math.exp(math.copysign(max(abs(move) - noise, 0.0), move))


@dataclass(frozen=True)
class Drift:
    """Time ratios, now over then, by the kind of work: >1 when the machine runs slower now;
    the moves beyond the probes' noise, with ``noise`` the largest combined spread of the
    probes (relative) and ``measured`` the largest move before the noise was taken off."""

    compute: float = 1.0
    memory: float = 1.0
    communication: float = 1.0
    noise: float = 0.0
    measured: float = 0.0

    def scale(self, kernel: str, communication: bool = False) -> float:
        """The factor for a kernel's predicted time (``communication``: a collective)."""
        if communication:
            return self.communication
        return self.compute if kernel in COMPUTE_BOUND else self.memory

    @property
    def moved(self) -> bool:
        """Whether the probes measured a move of more than :data:`DRIFT_WARNING`, noise or not."""
        return self.measured > DRIFT_WARNING

    def describe(self) -> str:
        noise = (f"; the probes measured moves up to {100 * self.measured:.0f} % and repeat within "
                 f"+-{100 * self.noise:.0f} %, a part of each move that is not corrected") if self.noise else ""
        return (f"GEMM x{self.compute:.3f}, memory x{self.memory:.3f}, communication x{self.communication:.3f} "
                f"(time now over time at calibration{noise})")


def drift_between(then: MachineState, now: MachineState,
                  allreduce_model: Callable[[float, int], float] | None = None) -> Drift:
    """The drift from the calibration's probe ``then`` to a run's probe ``now``.

    Communication compares the two probes' Allreduce: directly when they timed the same
    ranks and bytes, otherwise through ``allreduce_model(bytes, ranks)``, the calibration's
    model, which says how much longer the run's Allreduce takes than the calibration's
    on an unmoved machine. Without both probes' Allreduce (or the model, where it is
    needed) communication is taken as unmoved. Each ratio keeps only its move beyond the
    two probes' spreads (:func:`beyond_noise`).
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
    measured = {"compute": (then.gemm_flops / now.gemm_flops, then.gemm_spread, now.gemm_spread),
                "memory": (then.copy_bytes_per_second / now.copy_bytes_per_second, then.copy_spread, now.copy_spread),
                "communication": (communication, then.allreduce_spread, now.allreduce_spread)}
    return Drift(**{kind: beyond_noise(*figures) for kind, figures in measured.items()},
                 noise=max(math.hypot(then_spread, now_spread) for _, then_spread, now_spread in measured.values()),
                 measured=max(abs(ratio - 1.0) for ratio, _, _ in measured.values()))
