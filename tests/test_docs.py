"""The documentation's examples run as written.

In each page, the ```python blocks form one script, run in order (as docs/api.md says of
its own); a block right after a ``<!-- fragment -->`` line (a signature, or a piece that
needs a model or a trace the page does not build) is not run. A shell block right after
``<!-- run -->`` runs too, each on its own, with the package's commands on PATH. Both run
in a temporary directory that sees the repository's calibration/ folder.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest

from mpi import REPO

PAGES = sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))) + [os.path.join(REPO, "README.md")]
BLOCK = re.compile(r"(<!-- (fragment|run) -->\n)?```(\w*)\n(.*?)```", re.S)


def blocks(page: str) -> tuple[str, list[str]]:
    """The page's Python script and its shell blocks marked to run."""
    text = open(page, encoding="utf-8").read()
    python, shell = [], []
    for match in BLOCK.finditer(text):
        mark, language, code = match.group(2), match.group(3), match.group(4)
        if language == "python" and mark != "fragment":
            python.append(code)
        elif mark == "run":
            shell.append(code)
    return "\n".join(python), shell


def in_a_scratch_directory(tmp_path) -> dict[str, str]:
    os.symlink(os.path.join(REPO, "calibration"), tmp_path / "calibration")
    return dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", PYTHONUNBUFFERED="1")


RUNNABLE = [page for page in PAGES if any(blocks(page))]


@pytest.mark.parametrize("page", RUNNABLE, ids=[os.path.relpath(page, REPO) for page in RUNNABLE])
def test_a_page_s_examples_run(tmp_path, page):
    env = in_a_scratch_directory(tmp_path)
    script, commands = blocks(page)
    if script:
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env,
                                timeout=600)
        assert result.returncode == 0, f"{page}'s Python blocks:\n{result.stderr[-3000:]}"
    for command in commands:
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", command], capture_output=True, text=True,
                                cwd=tmp_path, env=env, timeout=600)
        assert result.returncode == 0, f"{page}:\n{command}\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
        assert "Traceback" not in result.stderr, command


def test_fragments_are_marked_so_and_scripts_are_found():
    # The pages this test reads: a renamed marker or language tag would silently run nothing.
    assert len(RUNNABLE) >= 5
    assert "build_trainer" in blocks(os.path.join(REPO, "docs", "api.md"))[0]
