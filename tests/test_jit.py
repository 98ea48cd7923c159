"""Numba compilations shared by a host's processes (kernels/jit.py)."""
import json
import os
import subprocess
import sys
import textwrap
import time

# A parallel loop (a second or so to compile) in a module of its own, so that its cache
# starts empty; each process calls it once at an agreed instant and reports from where
# its machine code came.
PROBE = textwrap.dedent("""
    import json, sys, time

    import numpy as np
    from numba import prange

    from pydtnn_lite.kernels.jit import compiled


    @compiled(parallel=True)
    def doubled_sum(x):
        total = 0.0
        for i in prange(x.size):
            total += 2.0 * x[i]
        return total


    time.sleep(max(0.0, float(sys.argv[1]) - time.time()))
    value = doubled_sum(np.arange(100.0))
    stats = doubled_sum.dispatcher.stats
    print(json.dumps({"value": value, "compiled": sum(stats.cache_misses.values()),
                      "read": sum(stats.cache_hits.values())}))
""")


def test_a_function_compiles_on_each_core_at_most_and_waiting_processes_read_it(tmp_path):
    """Three processes on two cores (one where the host has one) call a function at once:
    as many compile it as there are cores (the lock's holder, and beside it on the spare
    core), and the others wait and then find it in the cache."""
    allowed = set(sorted(os.sched_getaffinity(0))[:2])
    cores = len(allowed)
    (tmp_path / "probe_loop.py").write_text(PROBE)
    # Its own temporary folder, so that its locks are the test's alone.
    env = {**os.environ, "TMPDIR": str(tmp_path), "NUMBA_NUM_THREADS": "1"}
    env.pop("NUMBA_CACHE_DIR", None)
    at = str(time.time() + 3.0)  # after all three have imported Numba
    processes = [subprocess.Popen([sys.executable, "probe_loop.py", at], cwd=tmp_path, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  preexec_fn=lambda: os.sched_setaffinity(0, allowed)) for _ in range(3)]
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-2000:]
        reports.append(json.loads(out))
    assert all(report["value"] == 9900.0 for report in reports)
    assert sorted(report["compiled"] for report in reports) == [0] * (3 - cores) + [1] * cores
    assert sorted(report["read"] for report in reports) == [0] * cores + [1] * (3 - cores)
