"""How much of a gradient bucket's reduction its own calls do where blocking reductions follow it on one node.

MPICH moves a non-blocking reduction's data only inside MPI calls, and any call advances
every collective outstanding on the communicator. On one node the synchronizer's tests
after each kernel do a bucket's copying and summing a phase at a time; a blocking
reduction made while the bucket is outstanding (a batch-norm layer's statistics in
backward, one or two kernels after the bucket's post) spins in MPICH's progress engine
until its own sums arrive, and those wait behind the bucket's phases: it finishes most of
the bucket. A traced 2-rank DenseNet121 b16 step spent 0.4-0.9 ms in each 4 MiB bucket's
post and tests, where its blocking Allreduce takes 1.6 ms, and its batch norms' backward
reductions the rest (docs/performance.md, 'Where a bucket's reduction runs on one node').

``calibrate`` times both (``measuring/bucket_progress.py``), after an eviction of the
caches as its Allreduce samples: a bucket's blocking Allreduce, and the seconds in its
post, tests and wait with a small blocking Allreduce after every kernel between them. A
prediction keeps :meth:`BucketProgress.share_left` of a bucket's time in its own calls
(COMM) and charges the rest to the first batch-norm reduction of backward after its post,
where it runs inside that reduction's wait for the slowest rank first.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BucketProgress:
    """On ``ranks`` ranks of one node, for buckets of ``sizes`` bytes: the median seconds of
    each one's blocking Allreduce (``blocking``), and of its own calls (post, tests, wait)
    with a small blocking Allreduce after every kernel between its post and its wait
    (``own_calls``)."""

    ranks: int
    sizes: tuple[int, ...]
    blocking: tuple[float, ...]
    own_calls: tuple[float, ...]

    def share_left(self, nbytes: float) -> float:
        """The share of a bucket of ``nbytes``'s reduction that its own calls do where blocking
        reductions follow its post: own over blocking seconds, interpolated in the sizes'
        logarithm, held at the smallest and largest size, within [0, 1]."""
        shares = np.clip(np.asarray(self.own_calls) / np.asarray(self.blocking), 0.0, 1.0)
        return float(np.interp(np.log(max(nbytes, 1.0)), np.log(self.sizes), shares))

    def summary(self) -> str:
        """Each size's share left, as a calibration's report and log print it."""
        return ", ".join(f"{n / 2 ** 20:g} MiB x{self.share_left(n):.2f}" for n in self.sizes)

    def to_dict(self) -> dict:
        return {"ranks": self.ranks, "sizes": list(self.sizes), "blocking": list(self.blocking),
                "own_calls": list(self.own_calls)}

    @classmethod
    def from_dict(cls, data: dict) -> BucketProgress:
        sizes = tuple(int(n) for n in data["sizes"])
        blocking = _seconds(data["blocking"])
        own_calls = _seconds(data["own_calls"])
        if not sizes or len(blocking) != len(sizes) or len(own_calls) != len(sizes):
            raise ValueError("bucket_progress: the blocking and own-call seconds must cover its sizes")
        if min(blocking) <= 0:
            raise ValueError("bucket_progress: a blocking Allreduce must take some time")
        return cls(int(data["ranks"]), sizes, blocking, own_calls)


def _seconds(values: Sequence) -> tuple[float, ...]:
    return tuple(float(value) for value in values)
