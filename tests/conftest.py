import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from pydtnn_lite.backend import CACHE_VARIABLE  # noqa: E402  (after the path: tests import their helpers by name)

# Calibrations and machine-state probes evict the last-level cache before each timed call. This
# machine reports its host's 260 MiB, so each eviction streams over a GiB on two ranks and they
# were most of the suite's time. No test asserts a timing: the tests and the jobs they start
# (which inherit the variable) evict a small cache instead, unless the caller states one.
os.environ.setdefault(CACHE_VARIABLE, "4M")
