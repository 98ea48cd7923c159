"""The calibration's cache-residency record, and when a calibrated machine applies it."""
from __future__ import annotations

import dataclasses
import os

import pytest

from pydtnn_lite.costs import ALLREDUCE
from pydtnn_lite.perfmodel.modelling.cache_residency import CacheResidency
from pydtnn_lite.perfmodel.modelling.calibration import Calibration
from pydtnn_lite.perfmodel.modelling.machines import CalibratedMachine, adjusted_machine
from pydtnn_lite.perfmodel.modelling.merging import merge_calibrations
from pydtnn_lite.perfmodel.modelling.placement import Placement

from mpi import REPO

MIB = 1 << 20
# At 1 MiB a resident reduction takes half its evicted time, at 4 MiB three quarters; an
# update resident is slower than evicted (noise): never above the evicted time.
RECORD = CacheResidency(2, (MIB, 4 * MIB), {ALLREDUCE: (0.5, 3.0), "sgd_update": (2.0, 2.0)},
                        {ALLREDUCE: (1.0, 4.0), "sgd_update": (1.0, 1.0)})


def test_the_ratio_is_interpolated_in_log_size_held_at_the_ends_and_at_most_one():
    assert RECORD.ratio(ALLREDUCE, MIB) == pytest.approx(0.5)
    assert RECORD.ratio(ALLREDUCE, 4 * MIB) == pytest.approx(0.75)
    assert RECORD.ratio(ALLREDUCE, 2 * MIB) == pytest.approx(0.625)  # halfway in log size
    assert RECORD.ratio(ALLREDUCE, 1024) == pytest.approx(0.5) and RECORD.ratio(ALLREDUCE, 1 << 30) == 0.75
    assert RECORD.ratio("sgd_update", MIB) == 1.0
    assert RECORD.ratio("adam_update", MIB) == 1.0  # not timed


def test_the_ratio_applies_only_where_what_was_moved_since_fits_in_the_cache():
    assert RECORD.factor(ALLREDUCE, MIB, 32 * MIB, 32 * MIB) == pytest.approx(0.5)
    assert RECORD.factor(ALLREDUCE, MIB, 32 * MIB + 1, 32 * MIB) == 1.0
    assert RECORD.factor(ALLREDUCE, MIB, 8 * MIB, 0) == 1.0  # no cache named


# The update timed resident (half its evicted time) and after waits of 2 and 8 ms since its
# data's last use: 0.5 and 0.9 of it at 1 MiB, at 4 MiB a wait's noise below the resident time.
WAITED = dataclasses.replace(RECORD, resident={**RECORD.resident, "sgd_update": (0.5, 2.0)},
                             evicted={**RECORD.evicted, "sgd_update": (1.0, 4.0)}, idle_seconds=(0.002, 0.008),
                             idle={"sgd_update": ((0.5, 1.6), (0.9, 4.4))})


def test_the_ratio_follows_the_time_since_the_data_s_last_use():
    assert WAITED.ratio("sgd_update", MIB) == pytest.approx(0.5)  # right after its last use
    assert WAITED.ratio("sgd_update", MIB, 0.002) == pytest.approx(0.5)
    assert WAITED.ratio("sgd_update", MIB, 0.005) == pytest.approx(0.7)  # halfway between the waits
    assert WAITED.ratio("sgd_update", MIB, 0.008) == WAITED.ratio("sgd_update", MIB, 1.0) == pytest.approx(0.9)
    # A longer wait cannot bring the data back: 2 ms takes the resident 0.5, not its 0.4.
    assert WAITED.ratio("sgd_update", 4 * MIB, 0.002) == pytest.approx(0.5)
    assert WAITED.ratio("sgd_update", 4 * MIB, 0.008) == 1.0
    assert WAITED.factor("sgd_update", MIB, 32 * MIB, 32 * MIB, 0.005) == pytest.approx(0.7)
    assert WAITED.factor("sgd_update", MIB, 32 * MIB + 1, 32 * MIB, 0.0) == 1.0
    # A kernel timed without waits (and a record written before them) is resident at any wait.
    assert WAITED.ratio(ALLREDUCE, MIB, 1.0) == RECORD.ratio(ALLREDUCE, MIB, 1.0) == pytest.approx(0.5)


def test_the_record_reads_back_and_a_damaged_one_is_refused():
    assert CacheResidency.from_dict(RECORD.to_dict()) == dataclasses.replace(
        RECORD, resident={k: tuple(v) for k, v in RECORD.resident.items()},
        evicted={k: tuple(v) for k, v in RECORD.evicted.items()})
    damaged = RECORD.to_dict()
    damaged["evicted"][ALLREDUCE] = [1.0]
    with pytest.raises(ValueError, match="cover its sizes"):
        CacheResidency.from_dict(damaged)
    waited = CacheResidency.from_dict(WAITED.to_dict())
    assert (waited.idle_seconds, waited.idle) == (WAITED.idle_seconds, WAITED.idle)
    assert waited.ratio("sgd_update", MIB, 0.005) == pytest.approx(0.7)
    older = RECORD.to_dict()
    del older["idle_seconds"], older["idle"], older["warm_evicted_updates"]  # written before either was timed
    assert CacheResidency.from_dict(older).idle == {} and not CacheResidency.from_dict(older).warm_evicted_updates
    warm = dataclasses.replace(RECORD, warm_evicted_updates=True)
    assert CacheResidency.from_dict(warm.to_dict()).warm_evicted_updates
    for key, value in (("idle_seconds", [0.002]), ("idle", {"sgd_update": [[0.5, 1.6], [0.9]]})):
        damaged = {**WAITED.to_dict(), key: value}
        with pytest.raises(ValueError, match="cover every wait and size"):
            CacheResidency.from_dict(damaged)


@pytest.fixture(scope="module")
def reference() -> Calibration:
    return Calibration.load(os.path.join(REPO, "calibration", "dev-2core.json"))


def test_a_calibrated_machine_counts_every_rank_of_the_node_against_the_processors_cache(reference, tmp_path):
    machine = {**reference.machine, "cpu_cache_bytes": 32 * MIB, "ranks": 2, "ranks_per_node": 2}
    calibration = dataclasses.replace(reference, machine=machine, cache_residency=RECORD)
    path = tmp_path / "resident.json"
    calibration.save(str(path))
    calibrated = CalibratedMachine(Calibration.load(str(path)), None)
    assert calibrated.cache_factor(ALLREDUCE, MIB, 16 * MIB) == pytest.approx(0.5)  # 2 ranks x 16 MiB fit
    assert calibrated.cache_factor(ALLREDUCE, MIB, 16 * MIB + 1) == 1.0
    # Placed 4 ranks to the node, the same bytes a rank fill the cache twice over.
    four = adjusted_machine(calibrated, Placement(4, 4, 2))
    assert four.cache_factor(ALLREDUCE, MIB, 8 * MIB) == pytest.approx(0.5)
    assert four.cache_factor(ALLREDUCE, MIB, 16 * MIB) == 1.0


def test_a_calibration_without_the_record_predicts_every_call_evicted(reference):
    older = dataclasses.replace(reference, cache_residency=None)  # files written before it was timed
    machine = adjusted_machine(CalibratedMachine(older, None))
    assert machine.cache_factor(ALLREDUCE, MIB, 1.0) == 1.0 and machine.cache_factor("sgd_update", MIB, 1.0) == 1.0
    assert any("no cache residency" in line and "--allreduce-only" in line for line in machine.warnings([]))
    assert not any("cache residency" in line for line in adjusted_machine(CalibratedMachine(
        dataclasses.replace(older, cache_residency=RECORD), None)).warnings([]))


def test_a_record_whose_evicted_updates_came_first_after_the_eviction_is_named_where_a_step_updates(reference):
    def warnings(record: CacheResidency, kernels: list[str]) -> list[str]:
        machine = adjusted_machine(CalibratedMachine(dataclasses.replace(reference, cache_residency=record), None))
        return [line for line in machine.warnings(kernels) if "first call after an eviction" in line]

    [line] = warnings(RECORD, ["gemm", "sgd_update"])
    assert "--allreduce-only" in line
    assert warnings(RECORD, ["gemm", ALLREDUCE]) == []  # its Allreduce is timed as its samples are
    assert warnings(dataclasses.replace(RECORD, warm_evicted_updates=True), ["gemm", "sgd_update"]) == []


def test_a_merge_keeps_the_first_files_residency(reference):
    older = dataclasses.replace(reference, cache_residency=None)
    newer = dataclasses.replace(reference, cache_residency=RECORD)
    assert merge_calibrations([older, newer]).cache_residency == RECORD
    assert merge_calibrations([older, older]).cache_residency is None


class _SpyRanks:
    """One rank that notes each Allreduce's length, standing in for the communicator."""

    def __init__(self, log: list) -> None:
        self.log = log

    def barrier(self) -> None:
        pass

    def allreduce_bare(self, buffer):
        self.log.append((ALLREDUCE, buffer.size))
        return buffer


def test_an_evicted_update_follows_an_update_of_other_arrays_and_an_evicted_allreduce_the_eviction(monkeypatch):
    # The calibration samples an update after another (a step's first pays the cold start
    # apart): an evicted update timed as the first call after the eviction took 85-90 us
    # more, so its ratios scaled the samples' time by too little.
    from pydtnn_lite import kernels
    from pydtnn_lite.perfmodel.measuring import cache_residency as measuring

    log: list = []
    for name in ("sgd_update", "adam_update"):
        monkeypatch.setattr(kernels, name, lambda param, *rest, name=name: log.append((name, param.size)))
    count = 1024
    measuring._rank_seconds(_SpyRanks(log), count, lambda: log.append("evict"), calls=1, rounds=1, waits=())
    timed = [index for index, entry in enumerate(log) if entry != "evict" and entry[1] == count]
    evictions = [index for index, entry in enumerate(log) if entry == "evict"]
    # Each eviction's calls up to the timed one, in the order the kernels are timed.
    assert [log[start + 1:next(index for index in timed if index > start) + 1] for start in evictions] == [
        [(ALLREDUCE, count)],
        [("sgd_update", measuring.WARM_UP_COUNT), ("sgd_update", count)],
        [("adam_update", measuring.WARM_UP_COUNT), ("adam_update", count)]]
