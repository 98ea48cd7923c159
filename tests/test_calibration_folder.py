"""Which file of a folder of calibrations a run takes, and which processor a record names."""
from __future__ import annotations

import json

import pytest

from pydtnn_lite.backend import CACHE_VARIABLE, host_last_level_cache_bytes, sysfs_last_level_cache_bytes
from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.measuring.host import cpu_generation, cpu_model, this_processor, vector_unit
from pydtnn_lite.perfmodel.modelling.calibration import FORMAT, VERSION
from pydtnn_lite.perfmodel.modelling.calibration_folder import calibration_file
from pydtnn_lite.perfmodel.modelling.processors import Processor

XEON, EPYC = Processor("Intel Xeon"), Processor("AMD EPYC")


def header(folder, name: str, cpu_model: str, date: str, device: str = "cpu", network: dict | None = None,
           **machine: object) -> str:
    """A calibration file's header, ``machine`` adding to its machine record: all that choosing
    among a folder's files reads."""
    path = folder / name
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "network": network,
                                "machine": {"cpu_model": cpu_model, "device": device, "date": date, **machine}}))
    return str(path)


def test_a_file_is_taken_as_it_is(tmp_path):
    path = header(tmp_path, "one.json", "Intel Xeon", "2026-11-28T08:00:00+00:00")
    assert calibration_file(path, EPYC) == path
    assert calibration_file(str(tmp_path / "absent.json"), EPYC) == str(tmp_path / "absent.json")


def test_the_newest_file_of_the_runs_processor_and_device_on_one_node(tmp_path):
    header(tmp_path, "a.json", "Intel Xeon", "2026-11-01T00:00:00+00:00")
    new_xeon = header(tmp_path, "b.json", "Intel Xeon", "2026-11-28T00:00:00+00:00")
    newest_epyc = header(tmp_path, "c.json", "AMD EPYC", "2026-11-30T00:00:00+00:00")
    header(tmp_path, "d.json", "Intel Xeon", "2026-12-01T00:00:00+00:00", network={"nodes": 2})
    header(tmp_path, "e.json", "Intel Xeon", "2026-12-02T00:00:00+00:00", device="gpu")
    (tmp_path / "notes.txt").write_text("not read")
    assert calibration_file(str(tmp_path), XEON) == new_xeon
    assert calibration_file(str(tmp_path), EPYC) == newest_epyc
    # No file of this processor: the newest of another one (its validation warns of it).
    assert calibration_file(str(tmp_path), Processor("Apple M3")) == newest_epyc
    assert calibration_file(str(tmp_path), XEON, "gpu") == str(tmp_path / "e.json")
    # Dates compare as instants, whatever their offsets from UTC; an undated file is the oldest.
    later = header(tmp_path, "f.json", "Intel Xeon", "2026-11-27T20:00:00-08:00")  # 04:00 UTC on the 28th
    header(tmp_path, "g.json", "Intel Xeon", "")
    assert calibration_file(str(tmp_path), XEON) == later


def test_a_folder_without_a_fitting_file_or_with_another_json_stops_with_one_line(tmp_path):
    header(tmp_path, "cluster.json", "Intel Xeon", "2026-11-28T00:00:00+00:00", network={"nodes": 2})
    with pytest.raises(UserError, match="holds no calibration of one node's cpu run.*calibrate --out"):
        calibration_file(str(tmp_path), XEON)
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps({"format": FORMAT, "version": VERSION, "machine": []}))
    with pytest.raises(UserError, match="damaged.json is a damaged calibration file.*calibrate again"):
        calibration_file(str(tmp_path), XEON)
    damaged.unlink()
    (tmp_path / "results.json").write_text(json.dumps({"step": 1.0}))
    with pytest.raises(UserError, match=r"results.json is not a calibration file.*every \.json file"):
        calibration_file(str(tmp_path), XEON)


def test_a_processor_is_its_name_and_its_widest_vector_unit():
    assert vector_unit("processor : 0\nflags : fpu sse2 avx avx2 fma\n\nprocessor : 1\nflags : fpu avx2\n") == "AVX2"
    assert vector_unit("flags\t\t: fpu avx avx2 avx512f avx512bw\n") == "AVX-512"
    assert vector_unit("Features\t: fp asimd evtstrm sve\n") == "SVE"  # ARM
    assert vector_unit("model name : a processor without flags\n") == ""
    # Records from before the vector unit was recorded name it by the BLAS kernels they list.
    assert Processor.of({"cpu_model": "AMD EPYC", "blas": [{"architecture": "SkylakeX"}] * 2}).vector_unit == "AVX-512"
    assert Processor.of({"cpu_model": "AMD EPYC", "vector_unit": "AVX2", "blas": [{"architecture": "SkylakeX"}]}) \
        == Processor("AMD EPYC", "AVX2")
    assert Processor.of({"cpu_model": "AMD EPYC", "blas": [{"architecture": "SkylakeX"}, {"architecture": "Haswell"}]
                         }).vector_unit == ""  # two libraries that disagree say nothing
    assert Processor.of({}) == Processor("")
    assert str(Processor("AMD EPYC", "AVX2")) == "AMD EPYC, AVX2" and str(EPYC) == "AMD EPYC"
    assert Processor.of(Processor("AMD EPYC", "AVX2").record()) == Processor("AMD EPYC", "AVX2")
    # One name, two vector units: two processors; a record that names no unit matches either.
    assert not Processor("AMD EPYC", "AVX2").same_as(Processor("AMD EPYC", "AVX-512"))
    assert Processor("AMD EPYC", "AVX2").same_as(EPYC) and EPYC.same_as(Processor("AMD EPYC", "AVX-512"))
    assert not XEON.same_as(EPYC)


def test_one_name_and_vector_unit_with_another_last_level_cache_is_another_processor(tmp_path):
    # A virtual machine's "Intel(R) Xeon(R) Processor" with AVX-512: models with 260 and 300 MiB.
    small, large = (Processor("Intel Xeon", "AVX-512", size << 20) for size in (260, 300))
    assert not small.same_as(large) and small.same_vector_unit(large)
    assert small.same_as(Processor("Intel Xeon", "AVX-512"))  # a record that names no cache matches either
    assert Processor.of(large.record()) == large
    assert str(large) == "Intel Xeon, AVX-512, 300 MiB of last-level cache"
    # Calibrations written before the processor's cache was recorded name it as their CPU machine's.
    assert Processor.of({"cpu_model": "Intel Xeon", "last_level_cache_bytes": 300 << 20}).cache_bytes == 300 << 20
    assert Processor.of({"cpu_model": "Intel Xeon", "device": "gpu", "last_level_cache_bytes": 50 << 20}
                        ).cache_bytes == 0  # a GPU's cache, not the processor's
    older = header(tmp_path, "a.json", "Intel Xeon", "2026-11-28T00:00:00+00:00", vector_unit="AVX-512",
                   last_level_cache_bytes=260 << 20)
    newer = header(tmp_path, "b.json", "Intel Xeon", "2026-12-02T00:00:00+00:00", vector_unit="AVX-512",
                   cpu_cache_bytes=300 << 20)
    header(tmp_path, "c.json", "Intel Xeon", "2026-12-03T00:00:00+00:00", vector_unit="AVX2")
    assert calibration_file(str(tmp_path), small) == older
    assert calibration_file(str(tmp_path), large) == newer
    # A cache no file has: the newest of the name and vector unit, before a newer one of another unit.
    assert calibration_file(str(tmp_path), Processor("Intel Xeon", "AVX-512", 320 << 20)) == newer


X86_CPUINFO = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
               "model name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f\n\n"
               "processor\t: 1\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n")


def test_a_processor_s_generation_is_its_family_and_model():
    assert cpu_generation(X86_CPUINFO) == "family 25 model 17"
    assert cpu_model(X86_CPUINFO) == "AMD EPYC" and vector_unit(X86_CPUINFO) == "AVX-512"
    assert cpu_generation("processor\t: 0\nFeatures\t: fp asimd sve\nCPU implementer\t: 0x41\n"
                          "CPU architecture: 8\nCPU part\t: 0xd0c\n") == "implementer 0x41 part 0xd0c"  # ARM
    assert cpu_generation("model name : a processor that names no family\n") == ""
    assert this_processor().generation == cpu_generation()


def test_one_name_vector_unit_and_cache_of_another_generation_is_another_processor(tmp_path):
    # A virtual machine's "AMD EPYC" with AVX-512 and 32 MiB of L3: a Zen 5 and a Zen 4.
    zen5, zen4 = (Processor("AMD EPYC", "AVX-512", 32 << 20, generation)
                  for generation in ("family 26 model 2", "family 25 model 17"))
    assert not zen5.same_as(zen4) and zen5.same_vector_unit(zen4) and zen5.same_cache(zen4)
    assert zen4.differs_from(zen5) and not zen4.differs_from(Processor("AMD EPYC", "AVX-512", 32 << 20))
    assert Processor.of(zen4.record()) == zen4
    assert str(zen4) == "AMD EPYC, AVX-512, 32 MiB of last-level cache, family 25 model 17"
    epyc = {"vector_unit": "AVX-512", "cpu_cache_bytes": 32 << 20}
    named_zen4 = header(tmp_path, "a.json", "AMD EPYC", "2026-12-02T00:00:00+00:00", cpu_generation=zen4.generation,
                        **epyc)
    unnamed = header(tmp_path, "b.json", "AMD EPYC", "2026-12-03T00:00:00+00:00", **epyc)
    named_zen5 = header(tmp_path, "c.json", "AMD EPYC", "2026-12-04T00:00:00+00:00", cpu_generation=zen5.generation,
                        **epyc)
    # Its own generation before a newer file that names none; a file that names none before another generation.
    assert calibration_file(str(tmp_path), zen4) == named_zen4
    assert calibration_file(str(tmp_path), zen5) == named_zen5
    assert calibration_file(str(tmp_path), Processor("AMD EPYC", "AVX-512", 32 << 20, "family 25 model 1")) == unnamed
    # A run that does not know its generation: the newest of its processor.
    assert calibration_file(str(tmp_path), Processor("AMD EPYC", "AVX-512", 32 << 20)) == named_zen5


def test_of_one_processor_s_files_a_run_takes_the_one_whose_blas_ran_its_kernels(tmp_path):
    # One processor calibrated with OpenBLAS's AVX-512 kernels and, under OPENBLAS_CORETYPE=Haswell, its AVX2 ones.
    epyc = Processor("AMD EPYC", "AVX-512", 32 << 20, "family 26 model 2")
    record = {"vector_unit": "AVX-512", "cpu_cache_bytes": 32 << 20, "cpu_generation": epyc.generation}
    haswell = header(tmp_path, "a.json", "AMD EPYC", "2026-12-02T00:00:00+00:00", blas=[{"architecture": "Haswell"}],
                     **record)
    skylakex = header(tmp_path, "b.json", "AMD EPYC", "2026-12-03T00:00:00+00:00",
                      blas=[{"architecture": "SkylakeX"}], **record)
    assert calibration_file(str(tmp_path), epyc, blas={"Haswell"}) == haswell
    assert calibration_file(str(tmp_path), epyc, blas={"SkylakeX"}) == skylakex
    assert calibration_file(str(tmp_path), epyc) == skylakex  # kernels unknown: the newest
    # Another processor's file of the run's kernels is not taken before the processor's own.
    header(tmp_path, "c.json", "Intel Xeon", "2026-12-04T00:00:00+00:00", blas=[{"architecture": "Haswell"}])
    assert calibration_file(str(tmp_path), epyc, blas={"Haswell"}) == haswell


def test_the_processor_s_cache_is_the_one_the_system_names_not_the_one_stated_to_evict(monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLE, "4M")
    assert host_last_level_cache_bytes() == 4 << 20
    assert this_processor().cache_bytes == (sysfs_last_level_cache_bytes() or 0)


def test_a_run_takes_the_file_of_its_vector_unit_before_a_newer_one_of_its_name(tmp_path):
    avx2 = header(tmp_path, "a.json", "AMD EPYC", "2026-11-01T00:00:00+00:00", vector_unit="AVX2")
    avx512 = header(tmp_path, "b.json", "AMD EPYC", "2026-11-28T00:00:00+00:00", blas=[{"architecture": "SkylakeX"}])
    header(tmp_path, "c.json", "Intel Xeon", "2026-11-30T00:00:00+00:00", vector_unit="AVX2")
    assert calibration_file(str(tmp_path), Processor("AMD EPYC", "AVX2")) == avx2
    assert calibration_file(str(tmp_path), Processor("AMD EPYC", "AVX-512")) == avx512
    # A run that does not know its unit, or whose unit no file of its name has: the newest of its name.
    assert calibration_file(str(tmp_path), EPYC) == avx512
    assert calibration_file(str(tmp_path), Processor("AMD EPYC", "AVX")) == avx512
