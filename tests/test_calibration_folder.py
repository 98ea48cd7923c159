"""Which file of a folder of calibrations a run takes."""
from __future__ import annotations

import json

import pytest

from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.modelling.calibration import FORMAT, VERSION
from pydtnn_lite.perfmodel.modelling.calibration_folder import calibration_file


def header(folder, name: str, cpu_model: str, date: str, device: str = "cpu", network: dict | None = None) -> str:
    """A calibration file's header: all that choosing among a folder's files reads."""
    path = folder / name
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "network": network,
                                "machine": {"cpu_model": cpu_model, "device": device, "date": date}}))
    return str(path)


def test_a_file_is_taken_as_it_is(tmp_path):
    path = header(tmp_path, "one.json", "Intel Xeon", "2026-11-28T08:00:00+00:00")
    assert calibration_file(path, "AMD EPYC") == path
    assert calibration_file(str(tmp_path / "absent.json"), "AMD EPYC") == str(tmp_path / "absent.json")


def test_the_newest_file_of_the_runs_processor_and_device_on_one_node(tmp_path):
    header(tmp_path, "a.json", "Intel Xeon", "2026-11-01T00:00:00+00:00")
    new_xeon = header(tmp_path, "b.json", "Intel Xeon", "2026-11-28T00:00:00+00:00")
    newest_epyc = header(tmp_path, "c.json", "AMD EPYC", "2026-11-30T00:00:00+00:00")
    header(tmp_path, "d.json", "Intel Xeon", "2026-12-01T00:00:00+00:00", network={"nodes": 2})
    header(tmp_path, "e.json", "Intel Xeon", "2026-12-02T00:00:00+00:00", device="gpu")
    (tmp_path / "notes.txt").write_text("not read")
    assert calibration_file(str(tmp_path), "Intel Xeon") == new_xeon
    assert calibration_file(str(tmp_path), "AMD EPYC") == newest_epyc
    # No file of this processor: the newest of another one (its validation warns of it).
    assert calibration_file(str(tmp_path), "Apple M3") == newest_epyc
    assert calibration_file(str(tmp_path), "Intel Xeon", "gpu") == str(tmp_path / "e.json")
    # Dates compare as instants, whatever their offsets from UTC; an undated file is the oldest.
    later = header(tmp_path, "f.json", "Intel Xeon", "2026-11-27T20:00:00-08:00")  # 04:00 UTC on the 28th
    header(tmp_path, "g.json", "Intel Xeon", "")
    assert calibration_file(str(tmp_path), "Intel Xeon") == later


def test_a_folder_without_a_fitting_file_or_with_another_json_stops_with_one_line(tmp_path):
    header(tmp_path, "cluster.json", "Intel Xeon", "2026-11-28T00:00:00+00:00", network={"nodes": 2})
    with pytest.raises(UserError, match="holds no calibration of one node's cpu run.*calibrate --out"):
        calibration_file(str(tmp_path), "Intel Xeon")
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps({"format": FORMAT, "version": VERSION, "machine": []}))
    with pytest.raises(UserError, match="damaged.json is a damaged calibration file.*calibrate again"):
        calibration_file(str(tmp_path), "Intel Xeon")
    damaged.unlink()
    (tmp_path / "results.json").write_text(json.dumps({"step": 1.0}))
    with pytest.raises(UserError, match=r"results.json is not a calibration file.*every \.json file"):
        calibration_file(str(tmp_path), "Intel Xeon")
