"""One run per output directory: a lock file naming its holder, refused to a second writer.

The lock is ``DIR/.pydtnn-lock``, a JSON record of the holder (run id, process id, host,
start time, command line). A second run that finds a live holder stops with one line
naming it; a lock whose process is gone (killed, crashed, aborted) is stale and taken
over. Liveness is checked on the holder's host only (its process id and start time,
since ids are reused); a lock held from another host is never taken over. Checking and
writing the lock happen under an ``flock`` on ``DIR/.pydtnn-lock.guard``, so two runs
taking over the same stale lock cannot both win.
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from pydtnn_lite.errors import UserError

LOCK_NAME = ".pydtnn-lock"
_held: dict[str, OutputLock] = {}  # real path of a directory: this process's lock on it


def process_start(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (None where /proc does not say)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists (never true of 0 or a negative id, which name groups)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@dataclass(frozen=True)
class Holder:
    """Who holds a lock."""

    run_id: str
    pid: int
    host: str
    started: str
    command: str
    process_start: str | None = None

    @classmethod
    def this_process(cls, run_id: str) -> Holder:
        return cls(run_id, os.getpid(), platform.node(), time.strftime("%Y-%m-%d %H:%M:%S"), " ".join(sys.argv),
                   process_start(os.getpid()))

    def describe(self) -> str:
        return (f"run {self.run_id} (process {self.pid} on {self.host}, started {self.started}: "
                f"{self.command or '?'})")

    def is_stale(self) -> bool:
        """Whether the holder's process is gone (decidable on its own host only)."""
        if self.host != platform.node():
            return False
        if not process_alive(self.pid):
            return True
        return self.process_start is not None and process_start(self.pid) != self.process_start


@contextmanager
def guarded(directory: str) -> Iterator[None]:
    """Hold the flock of ``directory``'s lock guard (a few milliseconds: check and write the lock)."""
    with open(os.path.join(directory, LOCK_NAME + ".guard"), "a", encoding="utf-8") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


class OutputLock:
    """The lock of one output ``directory``, given on the command line as ``flag``."""

    def __init__(self, directory: str, flag: str, run_id: str) -> None:
        self.directory, self.flag = directory, flag
        self.path = os.path.join(directory, LOCK_NAME)
        self.holder = Holder.this_process(run_id)

    def read_holder(self) -> Holder | None:
        """The holder recorded in the lock file; None when there is none, or it cannot be read (a torn record)."""
        try:
            with open(self.path, encoding="utf-8") as stream:
                return Holder(**json.load(stream))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError):
            return Holder("unknown", -1, platform.node(), "?", "")  # unreadable: no live process vouches for it

    def acquire(self) -> str | None:
        """Take the lock; UserError if a live run holds it. Returns a note when a stale lock was taken over."""
        note = None
        with guarded(self.directory):
            current = self.read_holder()
            if current is not None and current.pid != os.getpid():
                if not current.is_stale():
                    raise UserError(f"{self.flag} {self.directory} is in use by {current.describe()}: wait for "
                                    f"that run to end or give another {self.flag}; if it ended on another host, "
                                    f"delete {self.path}")
                note = f"{self.flag} {self.directory}: taking over the lock of {current.describe()}, which has ended"
            temporary = f"{self.path}.{os.getpid()}.tmp"
            with open(temporary, "w", encoding="utf-8") as stream:
                json.dump(asdict(self.holder), stream)
            os.replace(temporary, self.path)
        return note

    def release(self) -> None:
        """Remove the lock if this process still holds it."""
        with guarded(self.directory):
            current = self.read_holder()
            if current is not None and current.pid == os.getpid():
                os.unlink(self.path)


def lock_directory(directory: str, flag: str, run_id: str) -> str | None:
    """Hold ``directory`` for this process until it exits (once, whichever flags name it).

    Creates the directory; raises UserError if another live run holds it; returns a note
    when a stale lock was taken over.
    """
    os.makedirs(directory, exist_ok=True)
    key = os.path.realpath(directory)
    if key in _held:
        return None
    lock = OutputLock(directory, flag, run_id)
    note = lock.acquire()
    _held[key] = lock
    atexit.register(lock.release)
    return note


def release_all() -> None:
    """Release every lock of this process now (before an abort, which skips the exit handlers)."""
    for key, lock in list(_held.items()):
        lock.release()
        del _held[key]
