"""Command-line parsing shared by every command: numeric flags checked against their range as they
are parsed, and a bad flag reported as one line with exit status 2.

Each numeric flag gets one of the argparse ``type`` functions made here (:func:`integer`,
:func:`real`, :func:`weights`), so a value outside the flag's range (NaN, infinity, a
negative count...) never reaches the program: argparse reports it as ``PROG: error:
argument --FLAG: must be ..., got 'VALUE'``.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

USAGE_ERROR_EXIT = 2
# The rank of this process as the MPI launchers tell it, before MPI is started (mpiexec of MPICH and
# Open MPI, SLURM's srun): only the first rank of a job reports a bad flag.
LAUNCHER_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def launcher_rank() -> int:
    """This process's rank in its MPI job as the launcher's environment says (0 outside a job)."""
    for variable in LAUNCHER_RANK_VARIABLES:
        value = os.environ.get(variable, "")
        if value.isdigit():
            return int(value)
    return 0


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``PROG: error: ...``) on the job's first rank, exit 2.

    argparse prints the whole usage before the error, once per rank of an MPI job; the
    usage stays one ``--help`` away. A flag must be spelled out: argparse would take a
    prefix for the one flag it begins (``predict --ranks 8`` as ``--ranks-per-node 8``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        if launcher_rank() == 0:
            sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
            sys.stderr.flush()
        sys.exit(USAGE_ERROR_EXIT)


def _bound(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def describe_range(minimum: float | None, maximum: float | None, above: bool = False) -> str:
    """The allowed range in words, e.g. 'from 1 to 64' (``above``: the minimum is excluded)."""
    if minimum is not None and maximum is not None:
        return (f"above {_bound(minimum)} and at most {_bound(maximum)}" if above
                else f"from {_bound(minimum)} to {_bound(maximum)}")
    if minimum is not None:
        return f"{'above' if above else 'at least'} {_bound(minimum)}"
    if maximum is not None:
        return f"at most {_bound(maximum)}"
    return "any value"


class RangeType:
    """An argparse ``type`` that parses a number and checks its range; ``kind`` names what it parses."""

    def __init__(self, convert: Callable[[str], float], kind: str, minimum: float | None, maximum: float | None,
                 above: bool = False) -> None:
        self.convert, self.kind = convert, kind
        self.minimum, self.maximum, self.above = minimum, maximum, above

    @property
    def allowed(self) -> str:
        """What the flag takes, e.g. 'an integer at least 1'."""
        return f"{self.kind} {describe_range(self.minimum, self.maximum, self.above)}"

    def in_range(self, value: float) -> bool:
        """Whether a parsed ``value`` is finite and inside the range."""
        if not math.isfinite(value):
            return False
        if self.minimum is not None and (value <= self.minimum if self.above else value < self.minimum):
            return False
        return self.maximum is None or value <= self.maximum

    def __call__(self, text: str) -> float:
        try:
            value = self.convert(text.strip())
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"must be {self.allowed}, got {text!r}") from None
        if not self.in_range(value):
            raise argparse.ArgumentTypeError(f"must be {self.allowed}, got {text!r}")
        return value


def integer(minimum: int | None = None, maximum: int | None = None) -> RangeType:
    """An argparse type: a whole number from ``minimum`` to ``maximum`` (either end open when None)."""
    return RangeType(int, "an integer", minimum, maximum)


def real(minimum: float | None = None, maximum: float | None = None, *, above: bool = False) -> RangeType:
    """An argparse type: a finite number from ``minimum`` (excluded when ``above``) to ``maximum``."""
    return RangeType(float, "a finite number", minimum, maximum, above)


COUNT = integer(1)  # steps, epochs, threads, ranks, samples
OPTIONAL_COUNT = integer(0)  # the same where 0 means none or off
SEED = integer(0, 2**32 - 1)  # what NumPy's generators accept
BUCKET_MIB = real(0.001, 65536.0)  # 1 KiB to 64 GiB: below it, the buckets outnumber the kernels by far
MAX_WEIGHT = 1e6  # one rank's share of the batch next to another's: more would round the others to nothing


class WeightList:
    """An argparse type: comma-separated weights, each finite from 0 to :data:`MAX_WEIGHT`, with a positive sum."""

    allowed = f"comma-separated numbers from 0 to {MAX_WEIGHT:g} with a positive sum, e.g. 1,3"

    def __call__(self, text: str) -> tuple[float, ...]:
        check = real(0.0, MAX_WEIGHT)
        try:
            values = tuple(check(part) for part in text.split(","))
        except argparse.ArgumentTypeError:
            values = ()
        if not values or sum(values) <= 0:
            raise argparse.ArgumentTypeError(f"must be {self.allowed}, got {text!r}")
        return values


def weights() -> WeightList:
    """An argparse type: one weight per rank, as ``--partition`` takes them."""
    return WeightList()


class RankValue:
    """An argparse type: ``RANK:VALUE``, the rank a non-negative integer and the value of type ``value``."""

    def __init__(self, value: RangeType, example: str) -> None:
        self.value, self.example = value, example

    @property
    def allowed(self) -> str:
        return f"RANK:VALUE with RANK {describe_range(0, None)} and VALUE {self.value.allowed}, e.g. {self.example}"

    def __call__(self, text: str) -> tuple[int, float]:
        rank_text, _, value_text = text.partition(":")
        try:
            return int(OPTIONAL_COUNT(rank_text)), self.value(value_text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"must be {self.allowed}, got {text!r}") from None


def rank_value(value: RangeType, example: str) -> RankValue:
    """An argparse type: ``RANK:VALUE`` with VALUE checked by ``value``; ``example`` is shown in errors."""
    return RankValue(value, example)


class ModelBatch:
    """An argparse type: ``MODEL:BATCH[:DATASET]``, BATCH a count; the names are checked by the command."""

    allowed = f"MODEL:BATCH[:DATASET] with BATCH {describe_range(1, None)}, e.g. vgg11:32 or lenet:64:digits"

    def __call__(self, text: str) -> tuple[str, int, str]:
        parts = text.split(":")
        try:
            if len(parts) not in (2, 3) or not parts[0]:
                raise argparse.ArgumentTypeError(text)
            return parts[0], int(COUNT(parts[1])), parts[2] if len(parts) == 3 else "synthetic"
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"must be {self.allowed}, got {text!r}") from None


MODEL_BATCH = ModelBatch()
# The types a flag that parses its value must have (see tests/test_flags.py).
CHECKED_TYPES = (RangeType, WeightList, RankValue, ModelBatch)
