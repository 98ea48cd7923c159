"""Output paths checked before any work is done: a run should not fail after hours on an unwritable path."""
from __future__ import annotations

import os

from pydtnn_lite.errors import UserError


def check_writable(directory: str, flag: str) -> None:
    """Create ``directory`` and prove a file can be written there; UserError naming ``flag`` if not."""
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".write-test-{os.getpid()}")
        with open(probe, "w", encoding="utf-8"):
            pass
        os.unlink(probe)
    except OSError as error:
        raise UserError(f"cannot write to {flag} {directory} ({error.strerror}): choose a writable directory") from None


def check_writable_file(path: str, flag: str) -> None:
    """Refuse a ``path`` that is a directory or whose folder cannot be written (the folder is created)."""
    if os.path.isdir(path):
        raise UserError(f"cannot write to {flag} {path}: it is a directory; give a file name")
    check_writable(os.path.dirname(os.path.abspath(path)), flag)
