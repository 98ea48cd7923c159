"""The package imports whole from a source checkout, as `python -m pydtnn_lite.train` run there does."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

from mpi import REPO


def test_the_model_zoo_imports_from_a_checkout_without_an_editable_install():
    # -S skips site-packages' .pth files, and with them the editable install's import hook;
    # the dependencies are then added by hand, as a plain `pip install .` would leave them.
    site_packages = sysconfig.get_paths()["purelib"]
    code = (f"import sys; sys.path[:0] = [{REPO!r}]; sys.path.append({site_packages!r}); "
            "import pydtnn_lite.models as zoo; print(zoo.__file__); print(len(zoo.model_names()))")
    result = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    path, count = result.stdout.split()
    assert path == os.path.join(REPO, "models", "__init__.py") and int(count) >= 8
