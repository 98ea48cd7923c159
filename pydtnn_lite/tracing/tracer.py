"""The tracer: times every kernel of a rank's training steps, wrapping the code from outside.

Attaching a :class:`Tracer` to a :class:`~pydtnn_lite.training.Trainer` replaces, for as
long as it stays attached,

- each function of :mod:`pydtnn_lite.kernels` (layers call kernels only through that
  module, so this catches every compute kernel);
- the network's ``scope`` hook, which tells it the layer and stage (FP, BP, WU) a kernel
  runs for;
- the communicator's reductions and the requests they return, the data set's ``load``
  and the trainer's host-to-device copy;
- the trainer's step entry points, which open and close a traced step.

Layer code holds no timing calls, and nothing is replaced while no tracer is attached,
so an untraced run pays nothing. Compute kernels are timed with the backend's clock
(CUDA events on a GPU, read once per step), everything else with the host's counter.
At the end of a step each call is paired with its analytic cost (``step_costs``) by
(layer, stage, kernel, occurrence), which gives its FLOPs and bytes.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from dataclasses import astuple
from typing import Any, Callable, Optional

from pydtnn_lite import kernels
from pydtnn_lite.backend import HostClock
from pydtnn_lite.network import no_scope
from pydtnn_lite.training import Trainer, step_costs
from pydtnn_lite.tracing.chrome import chrome_trace
from pydtnn_lite.tracing.records import (COMMUNICATION, COMPUTE, EVAL, EVENTS_FILE, NO_LAYER, STEPS_FILE, TRAIN,
                                         KernelRecord, StepRecord, write_meta, write_records)
from pydtnn_lite.tracing.summary import SUMMARY_FILE, write_summary

CHROME_FILE = "trace.json"

OUTSIDE = (NO_LAYER, "COMM")  # where gradient buckets and the loss reduction run: in no layer's scope


class _Scope:
    """Context manager that makes (layer, stage) current while it is open."""

    __slots__ = ("stack", "frame")

    def __init__(self, stack: list, frame: tuple[int, str]) -> None:
        self.stack, self.frame = stack, frame

    def __enter__(self) -> None:
        self.stack.append(self.frame)

    def __exit__(self, *exc: Any) -> None:
        self.stack.pop()


def _shapes(args: tuple) -> tuple:
    """Shapes of the array arguments of a call (one level into lists, for add and concat)."""
    out = []
    for arg in args:
        if hasattr(arg, "shape"):
            out.append(tuple(arg.shape))
        elif isinstance(arg, (list, tuple)) and arg and hasattr(arg[0], "shape"):
            out.extend(tuple(item.shape) for item in arg)
    return tuple(out)


def _nbytes(data: Any) -> int:
    """Bytes of an array, or of a list of float64 host values."""
    return data.nbytes if hasattr(data, "nbytes") else 8 * len(data)


class Tracer:
    """Records the kernels of ``trainer``'s steps on this rank.

    Steps before global step ``skip_steps`` (warm-up) are not recorded, nor those after
    ``max_steps`` recorded ones. Evaluation is recorded apart, as phase ``eval``.
    """

    def __init__(self, trainer: Trainer, skip_steps: int = 0, max_steps: Optional[int] = None) -> None:
        self.trainer = trainer
        self.network, self.comm = trainer.network, trainer.comm
        self.skip_steps, self.max_steps = skip_steps, max_steps
        self.device_clock, self.host_clock = self.network.backend.clock(), HostClock()
        self.kernels: list[KernelRecord] = []
        self.steps: list[StepRecord] = []
        self.origin = 0.0
        self._recording = False
        self._phase, self._step, self._batch = TRAIN, 0, 0
        self._step_start = 0.0
        self._stack: list[tuple[int, str]] = [OUTSIDE]
        self._depth = 0  # > 0 inside a timed call: calls nested in it are not timed again
        self._pending: list[tuple] = []
        self._undo: list[Callable[[], None]] = []
        self._costs: dict[int, dict[tuple, list]] = {}

    # ------------------------------------------------------------ attach / detach
    def attach(self) -> "Tracer":
        """Start observing the trainer. Collective: every rank must attach (it sets the common origin)."""
        self.comm.barrier()
        self.origin = time.perf_counter()
        for name in kernels.__all__:
            self._replace(kernels, name, self._timed(getattr(kernels, name), name, COMPUTE, self.device_clock))
        self._replace(self.network, "scope", self.scope)
        comm, trainer, host = self.comm, self.trainer, self.host_clock
        self._replace(comm, "allreduce", self._timed(comm.allreduce, "allreduce", COMMUNICATION, host, message=0))
        self._replace(comm, "allreduce_host", self._timed(comm.allreduce_host, "allreduce", COMMUNICATION, host,
                                                          message=0))
        self._replace(comm, "iallreduce", self._iallreduce(comm.iallreduce))
        self._replace(trainer.data, "load", self._timed(trainer.data.load, "data_load", COMPUTE, host, stage="DATA"))
        self._replace(trainer, "to_device", self._to_device(trainer.to_device))
        self._replace(trainer, "load_step", self._load_step(trainer.load_step))
        self._replace(trainer, "train_step", self._train_step(trainer.train_step))
        self._replace(trainer, "evaluate", self._evaluate(trainer.evaluate))
        return self

    def detach(self) -> None:
        """Put back everything :meth:`attach` replaced."""
        while self._undo:
            self._undo.pop()()

    def _replace(self, owner: Any, name: str, replacement: Callable) -> None:
        had_own = name in vars(owner)
        original = getattr(owner, name)
        setattr(owner, name, replacement)
        self._undo.append(lambda: setattr(owner, name, original) if had_own else delattr(owner, name))

    # ------------------------------------------------------------ timing
    def scope(self, layer: int, stage: str) -> Any:
        """The network's scope hook: kernels inside belong to ``layer`` in ``stage``."""
        return _Scope(self._stack, (layer, stage)) if self._recording else no_scope(layer, stage)

    def _timed(self, function: Callable, kernel: str, thread: str, clock: HostClock,
               stage: Optional[str] = None, message: Optional[int] = None) -> Callable:
        """``function`` timed as ``kernel``; ``message`` is the position of the array argument
        whose bytes a communication call moves."""
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self._recording or self._depth:
                return function(*args, **kwargs)
            self._depth += 1
            try:
                start = clock.stamp()
                result = function(*args, **kwargs)
                end = clock.stamp()
            finally:
                self._depth -= 1
            layer, current_stage = self._stack[-1]
            moved = _nbytes(args[message]) if message is not None else None
            self._pending.append((kernel, thread, clock, layer, stage or current_stage, self._batch,
                                  start, end, _shapes(args), moved))
            return result
        return timed

    def _iallreduce(self, start: Callable) -> Callable:
        """Times starting a non-blocking reduction, and the tests and wait of its request."""
        timed_start = self._timed(start, "allreduce_start", COMMUNICATION, self.host_clock, message=0)

        def iallreduce(array: Any) -> Any:
            request = timed_start(array)
            if self._recording:
                request.test = self._timed(request.test, "allreduce_progress", COMMUNICATION, self.host_clock)
                request.wait = self._timed(request.wait, "allreduce_wait", COMMUNICATION, self.host_clock)
            return request
        return iallreduce

    def _to_device(self, copy: Callable) -> Callable:
        timed = self._timed(copy, "h2d_copy", COMPUTE, self.device_clock, stage="DATA", message=0)

        def to_device(images: Any, labels: Any) -> tuple[Any, Any]:
            self._batch = len(images)  # the batch the coming kernels run on, for their costs
            return timed(images, labels)
        return to_device

    # ------------------------------------------------------------ steps
    def _begin(self, phase: str) -> None:
        step = self.trainer.global_step
        wanted = phase == EVAL or (step >= self.skip_steps
                                   and (self.max_steps is None or len(self.steps) < self.max_steps))
        if not wanted or self._recording:
            return
        self._phase, self._step, self._recording = phase, step, True
        self.device_clock.start_step()
        self._step_start = time.perf_counter()

    def _end(self) -> None:
        if not self._recording:
            return
        self._recording = False
        end = time.perf_counter()
        if self._phase == TRAIN:
            self.steps.append(StepRecord(self.comm.rank, self._step, self._step_start - self.origin,
                                         end - self._step_start, self._batch))
        self._resolve()

    def _load_step(self, load: Callable) -> Callable:
        def load_step(epoch: int, step: int) -> Any:
            self._begin(TRAIN)
            return load(epoch, step)
        return load_step

    def _train_step(self, train: Callable) -> Callable:
        def train_step(images: Any, labels: Any, *args: Any, **kwargs: Any) -> Any:
            self._begin(TRAIN)
            self._batch = len(images)
            try:
                return train(images, labels, *args, **kwargs)
            finally:
                self._end()
        return train_step

    def _evaluate(self, evaluate: Callable) -> Callable:
        def traced_evaluate(*args: Any, **kwargs: Any) -> Any:
            self._begin(EVAL)
            try:
                return evaluate(*args, **kwargs)
            finally:
                self._end()
        return traced_evaluate

    # ------------------------------------------------------------ output
    def save(self, directory: str, meta: dict) -> None:
        """Gather every rank's records on rank 0, which writes the trace directory. Collective."""
        kernels = self.comm.gather_object([astuple(r) for r in self.kernels])
        steps = self.comm.gather_object([astuple(s) for s in self.steps])
        if self.comm.rank != 0:
            return
        all_kernels = [KernelRecord(*row) for rank_rows in kernels for row in rank_rows]
        all_steps = [StepRecord(*row) for rank_rows in steps for row in rank_rows]
        os.makedirs(directory, exist_ok=True)
        write_records(os.path.join(directory, EVENTS_FILE), all_kernels, KernelRecord)
        write_records(os.path.join(directory, STEPS_FILE), all_steps, StepRecord)
        write_summary(os.path.join(directory, SUMMARY_FILE), all_kernels)
        write_meta(directory, meta)
        with open(os.path.join(directory, CHROME_FILE), "w", encoding="utf-8") as handle:
            json.dump(chrome_trace(all_kernels, all_steps, meta.get("device", "")), handle)

    # ------------------------------------------------------------ records
    def _resolve(self) -> None:
        """Turn the step's raw timestamps into records with their analytic costs."""
        by_clock: dict[int, list] = defaultdict(list)
        for index, entry in enumerate(self._pending):
            by_clock[id(entry[2])].append(index)
        seconds: dict[int, tuple[float, float]] = {}
        for indices in by_clock.values():
            clock = self._pending[indices[0]][2]
            times = clock.resolve([stamp for i in indices for stamp in self._pending[i][6:8]])
            for position, i in enumerate(indices):
                seconds[i] = (times[2 * position], times[2 * position + 1])
        calls: dict[tuple, int] = defaultdict(int)
        layers = self.network.layers
        for index, (kernel, thread, _, layer, stage, batch, _, _, shapes, moved) in enumerate(self._pending):
            start, end = seconds[index]
            key = (layer, stage, kernel)
            candidates = self._costs_of(batch).get(key) if thread == COMPUTE else None
            if candidates:
                cost = candidates[calls[key] % len(candidates)]
                calls[key] += 1
                flops, nbytes = cost.flops, cost.bytes
            elif thread == COMMUNICATION:  # a request's bytes count once, where it starts
                flops, nbytes = 0.0, float(moved or 0)
            elif stage == "DATA":
                flops, nbytes = 0.0, math.nan if moved is None else float(moved)
            else:
                flops, nbytes = math.nan, math.nan
            name, kind = ((layers[layer].name, layers[layer].kind) if 0 <= layer < len(layers)
                          else ("loss", self.trainer.loss.kind) if layer == self.network.loss_index else ("", ""))
            self.kernels.append(KernelRecord(
                self.comm.rank, self._phase, self._step, stage, layer, name, kind, kernel, thread,
                start - self.origin, end - start, " ".join("x".join(map(str, s)) for s in shapes), flops, nbytes))
        self._pending = []

    def _costs_of(self, batch: int) -> dict[tuple, list]:
        """Analytic costs of a step on ``batch`` samples, keyed by (layer, stage, kernel)."""
        if batch not in self._costs:
            table: dict[tuple, list] = defaultdict(list)
            for layer, cost in step_costs(self.network, self.trainer.optimizer, batch):
                table[(layer, cost.stage, cost.kernel)].append(cost)
            self._costs[batch] = table
        return self._costs[batch]
