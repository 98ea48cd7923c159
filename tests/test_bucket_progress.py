"""The calibration's bucket-progress record, and when a calibrated machine applies it."""
from __future__ import annotations

import dataclasses
import os

import pytest

from pydtnn_lite.costs import ALLREDUCE
from pydtnn_lite.perfmodel.modelling.bucket_progress import BucketProgress
from pydtnn_lite.perfmodel.modelling.calibration import Calibration
from pydtnn_lite.perfmodel.modelling.machines import CalibratedMachine, adjusted_machine
from pydtnn_lite.perfmodel.modelling.merging import merge_calibrations
from pydtnn_lite.perfmodel.modelling.placement import Placement

from mpi import REPO

MIB = 1 << 20
# A 1 MiB bucket's own calls do a quarter of its blocking time, a 4 MiB one's half; a 16 MiB
# one's took longer than blocking (noise): never more than all of it.
RECORD = BucketProgress(2, (MIB, 4 * MIB, 16 * MIB), (1.0, 4.0, 10.0), (0.25, 2.0, 12.0))


def test_the_share_left_is_interpolated_in_log_size_held_at_the_ends_and_at_most_one():
    assert RECORD.share_left(MIB) == pytest.approx(0.25)
    assert RECORD.share_left(2 * MIB) == pytest.approx(0.375)  # halfway in log size
    assert RECORD.share_left(4 * MIB) == pytest.approx(0.5)
    assert RECORD.share_left(1024) == pytest.approx(0.25)
    assert RECORD.share_left(16 * MIB) == 1.0 and RECORD.share_left(1 << 30) == 1.0


def test_the_record_reads_back_and_a_damaged_one_is_refused():
    assert BucketProgress.from_dict(RECORD.to_dict()) == RECORD
    short = RECORD.to_dict()
    short["own_calls"] = [0.25]
    with pytest.raises(ValueError, match="cover its sizes"):
        BucketProgress.from_dict(short)
    instant = RECORD.to_dict()
    instant["blocking"] = [0.0, 4.0, 10.0]
    with pytest.raises(ValueError, match="must take some time"):
        BucketProgress.from_dict(instant)


@pytest.fixture(scope="module")
def reference() -> Calibration:
    return Calibration.load(os.path.join(REPO, "calibration", "dev-2core.json"))


def test_a_calibrated_machine_applies_the_record_with_a_rank_per_core_only(reference, tmp_path):
    path = tmp_path / "progress.json"
    dataclasses.replace(reference, bucket_progress=RECORD).save(str(path))
    calibrated = CalibratedMachine(Calibration.load(str(path)), None)
    assert calibrated.bucket_share_left(MIB, 2) == pytest.approx(0.25)
    assert calibrated.bucket_share_left(MIB, 1) == 1.0  # one rank reduces nothing
    assert adjusted_machine(calibrated, Placement(2, 2, 2)).bucket_share_left(MIB, 2) == pytest.approx(0.25)
    # Four ranks on two cores: a rank waiting in a blocking call gives its core away.
    assert adjusted_machine(calibrated, Placement(4, 4, 2)).bucket_share_left(MIB, 4) == 1.0


def test_without_the_record_a_bucket_is_left_whole_to_its_own_calls_and_a_merge_keeps_the_first(reference):
    older = dataclasses.replace(reference, bucket_progress=None)  # files written before it was timed
    machine = adjusted_machine(CalibratedMachine(older, None))
    assert machine.bucket_share_left(MIB, 2) == 1.0
    # Said where the step has batch-norm reductions (a compute kernel named allreduce), not elsewhere.
    assert any("no bucket progress" in line and "--allreduce-only" in line
               for line in machine.warnings(["gemm", ALLREDUCE]))
    assert not any("bucket progress" in line for line in machine.warnings(["gemm"]))
    assert not any("bucket progress" in line for line in adjusted_machine(CalibratedMachine(
        dataclasses.replace(reference, bucket_progress=RECORD), None)).warnings(["gemm", ALLREDUCE]))
    newer = dataclasses.replace(reference, bucket_progress=RECORD)
    assert merge_calibrations([older, newer]).bucket_progress == RECORD
    assert merge_calibrations([older, older]).bucket_progress is None
