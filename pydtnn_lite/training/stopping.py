"""Stopping a job on a signal at a step boundary, checkpointed, for a scheduler to requeue it.

SLURM warns a job before its time limit with the signal ``#SBATCH --signal`` names
(SIGUSR1 here) and ends it with SIGTERM; mpiexec and srun pass both on to every rank.
The handler only notes the signal. After each step the ranks agree, in one small
reduction, whether any of them got one, so all of them stop after the same step, even
when the signal reached only some ranks.
"""
from __future__ import annotations

import signal
from collections.abc import Sequence

from pydtnn_lite.comm import Communicator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
REQUEUE_EXIT = 75  # EX_TEMPFAIL of sysexits.h: a temporary failure, worth running again


class StopRequested(Exception):
    """A signal asked the job to stop: every rank has finished the same step."""

    def __init__(self, signal_name: str, global_step: int) -> None:
        super().__init__(f"stopped by {signal_name} after step {global_step}")
        self.signal_name, self.global_step = signal_name, global_step


class SignalStop:
    """Notes the ``signals`` this process receives; :meth:`after_step` stops the job at the step's end."""

    def __init__(self, comm: Communicator, signals: Sequence[signal.Signals] = STOP_SIGNALS) -> None:
        self.comm = comm
        self.received: int = 0  # the last signal's number, 0 while none came
        for number in signals:
            signal.signal(number, self._note)

    def _note(self, number: int, frame: object) -> None:
        self.received = number

    def after_step(self, global_step: int, result: object = None) -> None:
        """A step callback: raise StopRequested on every rank when any rank received a signal. Collective."""
        (largest,) = self.comm.allreduce_host([float(self.received)])  # summed: any rank's signal makes it > 0
        if largest:
            number = next(number for number in self.comm.allgather_object(self.received) if number)
            raise StopRequested(signal.Signals(number).name, global_step)
