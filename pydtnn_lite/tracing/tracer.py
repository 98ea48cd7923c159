"""The tracer: times every kernel of a rank's training steps, observing from outside the code it times.

Attaching a :class:`Tracer` to a :class:`~pydtnn_lite.training.Trainer`, for as long as
it stays attached,

- wraps each function of :mod:`pydtnn_lite.kernels` (``kernels.instrument``; layers call
  kernels only through that module, so this catches every compute kernel);
- sets the network's ``scope`` hook, which tells it the layer and stage (FP, BP, WU) a
  kernel runs for;
- puts a :class:`~pydtnn_lite.tracing.communicator.TracedCommunicator` in the gradient
  synchronizer's place, which times the step's reductions and the tests and waits of
  their requests;
- becomes the trainer's ``observer``, which opens and closes traced steps and times
  the data loading and the host-to-device copy.

Layer code holds no timing calls, and nothing is wrapped while no tracer is attached,
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
from collections.abc import Callable
from dataclasses import astuple
from typing import Any, NamedTuple, TypeVar

from pydtnn_lite import kernels
from pydtnn_lite.backend import HostClock
from pydtnn_lite.costs import (
    BUCKET_CALLS,
    DATA_LOAD,
    H2D_COPY,
    NO_LAYER,
    CallCounter,
    CallKey,
    KernelCost,
    Stage,
    keyed_costs,
)
from pydtnn_lite.network import no_scope
from pydtnn_lite.step_costs import step_costs
from pydtnn_lite.tracing.chrome import chrome_trace
from pydtnn_lite.tracing.communicator import TracedCommunicator, host_bytes
from pydtnn_lite.tracing.records import (
    COMMUNICATION,
    COMPUTE,
    DATA_THREAD,
    EVAL,
    EVENTS_FILE,
    STEPS_FILE,
    TRAIN,
    KernelRecord,
    StepRecord,
    write_meta,
    write_records,
)
from pydtnn_lite.tracing.summary import SUMMARY_FILE, write_summary
from pydtnn_lite.training import Trainer
from pydtnn_lite.training.observer import NO_OBSERVER, TrainingObserver

CHROME_FILE = "trace.json"

OUTSIDE = (NO_LAYER, Stage.COMM)  # where gradient buckets and the loss reduction run: in no layer's scope
T = TypeVar("T")


class _Scope:
    """Context manager that makes (layer, stage) current while it is open."""

    __slots__ = ("stack", "frame")

    def __init__(self, stack: list, frame: tuple[int, str]) -> None:
        self.stack, self.frame = stack, frame

    def __enter__(self) -> None:
        self.stack.append(self.frame)

    def __exit__(self, *exc: Any) -> None:
        self.stack.pop()


class _Call(NamedTuple):
    """One timed call of the current step, before its stamps are resolved into seconds."""

    kernel: str
    thread: str  # COMPUTE or COMMUNICATION
    clock: HostClock  # the clock that stamped it
    layer: int
    stage: str
    batch: int  # local samples of the step it ran in, for its analytic cost
    start: Any  # the clock's stamps
    end: Any
    shapes: tuple  # of its array arguments
    moved: int | None  # bytes a communication or copy moved (None: not counted)


def _shapes(args: tuple) -> tuple:
    """Shapes of the array arguments of a call (one level into lists, for add and concat)."""
    out = []
    for arg in args:
        if hasattr(arg, "shape"):
            out.append(tuple(arg.shape))
        elif isinstance(arg, (list, tuple)) and arg and hasattr(arg[0], "shape"):
            out.extend(tuple(item.shape) for item in arg)
    return tuple(out)


class Tracer(TrainingObserver):
    """Records the kernels of ``trainer``'s steps on this rank.

    Steps before global step ``skip_steps`` (warm-up) are not recorded, nor those after
    ``max_steps`` recorded ones. Evaluation is recorded apart, as phase ``eval``.
    """

    def __init__(self, trainer: Trainer, skip_steps: int = 0, max_steps: int | None = None) -> None:
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
        self._pending: list[_Call] = []
        self._undo: list[Callable[[], None]] = []
        self._costs: dict[tuple[int, int, bool], dict[CallKey, KernelCost]] = {}

    # ------------------------------------------------------------ attach / detach
    def attach(self) -> Tracer:
        """Start observing the trainer. Collective: every rank must attach (it sets the common origin)."""
        self.comm.barrier()
        self.origin = time.perf_counter()
        self._undo.append(kernels.instrument(
            lambda name, kernel: self._timed(kernel, name, COMPUTE, self.device_clock)))
        network, synchronizer, trainer = self.network, self.trainer.synchronizer, self.trainer
        network.scope = self.scope
        synchronizer.comm = TracedCommunicator(self.comm, self._time_communication)
        trainer.observer = self
        self._undo.append(lambda: setattr(network, "scope", no_scope))
        self._undo.append(lambda: setattr(synchronizer, "comm", self.comm))
        self._undo.append(lambda: setattr(trainer, "observer", NO_OBSERVER))
        return self

    def detach(self) -> None:
        """Put back everything :meth:`attach` replaced."""
        while self._undo:
            self._undo.pop()()

    # ------------------------------------------------------------ timing
    def scope(self, layer: int, stage: str) -> Any:
        """The network's scope hook: kernels inside belong to ``layer`` in ``stage``."""
        return _Scope(self._stack, (layer, stage)) if self._recording else no_scope(layer, stage)

    def _timed(self, function: Callable, kernel: str, thread: str, clock: HostClock,
               stage: str | None = None, moved: int | None = None) -> Callable:
        """``function`` timed as ``kernel``; ``moved`` is the bytes the call moves."""
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
            self._pending.append(_Call(kernel, thread, clock, layer, stage or current_stage, self._batch,
                                       start, end, _shapes(args), moved))
            return result
        return timed

    def _time_communication(self, kernel: str, function: Callable, args: tuple, moved: int | None) -> Any:
        """The traced communicator's timer: ``function(*args)`` on the communication timeline,
        in COMM where it is a call of the overlapped buckets (``BUCKET_CALLS``), else in the
        stage it runs in (a batch-norm reduction keeps its layer's)."""
        stage = Stage.COMM if kernel in BUCKET_CALLS else None
        return self._timed(function, kernel, COMMUNICATION, self.host_clock, stage, moved)(*args)

    def run(self, kernel: str, function: Callable[..., T], *args: Any) -> T:
        """The trainer's host work of a step (DATA_LOAD, or the H2D_COPY that fixes the step's batch)."""
        if kernel == H2D_COPY:
            self._batch = len(args[0])  # the batch the coming kernels run on, for their costs
            return self._timed(function, kernel, COMPUTE, self.device_clock, Stage.DATA, host_bytes(args[0]))(*args)
        return self._timed(function, kernel, COMPUTE, self.host_clock, Stage.DATA)(*args)

    def done_elsewhere(self, kernel: str, started: float, finished: float) -> None:
        """A batch read ahead on the prefetching thread: a record on the rank's data timeline."""
        if self._recording:
            self.kernels.append(KernelRecord(self.comm.rank, self._phase, self._step, Stage.DATA, NO_LAYER, "", "",
                                             kernel, DATA_THREAD, started - self.origin, finished - started, "",
                                             0.0, math.nan))

    # ------------------------------------------------------------ steps
    def step_started(self, phase: str, step: int, samples: int) -> None:
        """Open a traced step, unless it is a warm-up step, past ``max_steps`` or already open."""
        if self._recording:
            self._batch = samples or self._batch
            return
        wanted = phase == EVAL or (step >= self.skip_steps
                                   and (self.max_steps is None or len(self.steps) < self.max_steps))
        if not wanted:
            return
        self._phase, self._step, self._batch, self._recording = phase, step, samples, True
        self.device_clock.start_step()
        self._step_start = time.perf_counter()

    def step_finished(self) -> None:
        """Close the traced step and turn its calls into records."""
        if not self._recording:
            return
        self._recording = False
        end = time.perf_counter()
        if self._phase == TRAIN:
            self.steps.append(StepRecord(self.comm.rank, self._step, self._step_start - self.origin,
                                         end - self._step_start, self._batch))
        self._resolve()

    # ------------------------------------------------------------ output
    def save(self, directory: str, meta: dict) -> None:
        """Gather every rank's records on rank 0, which writes the trace directory. Collective."""
        kernels = self.comm.gather_object([astuple(r) for r in self.kernels])
        steps = self.comm.gather_object([astuple(s) for s in self.steps])
        if kernels is None or steps is None:  # not rank 0
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
        by_clock: dict[int, list[int]] = defaultdict(list)
        for index, call in enumerate(self._pending):
            by_clock[id(call.clock)].append(index)
        seconds: dict[int, tuple[float, float]] = {}
        for indices in by_clock.values():
            clock = self._pending[indices[0]].clock
            times = clock.resolve([stamp for i in indices for stamp in (self._pending[i].start, self._pending[i].end)])
            for position, i in enumerate(indices):
                seconds[i] = (times[2 * position], times[2 * position + 1])
        counter = CallCounter()
        layers = self.network.layers
        settings, training = self.trainer.settings, self._phase == TRAIN
        accumulate, clip = (settings.accumulate, settings.clip_grad_norm is not None) if training else (1, False)
        for index, call in enumerate(self._pending):
            start, end = seconds[index]
            if call.kernel == DATA_LOAD:  # a new batch: an evaluation runs the same kernels once per batch
                counter = CallCounter()
            key = counter.key(call.layer, call.stage, call.kernel)
            cost = self._costs_of(call.batch, accumulate, clip).get(key) if call.thread == COMPUTE else None
            if cost is not None:
                flops, nbytes = cost.flops, cost.bytes
            elif call.thread == COMMUNICATION:  # a request's bytes count once, where it starts
                flops, nbytes = 0.0, float(call.moved or 0)
            elif call.stage == Stage.DATA:
                flops, nbytes = 0.0, math.nan if call.moved is None else float(call.moved)
            else:
                flops, nbytes = math.nan, math.nan
            layer = call.layer
            name, kind = ((layers[layer].name, layers[layer].kind) if 0 <= layer < len(layers)
                          else ("loss", self.trainer.loss.kind) if layer == self.network.loss_index else ("", ""))
            self.kernels.append(KernelRecord(
                self.comm.rank, self._phase, self._step, call.stage, layer, name, kind, call.kernel, call.thread,
                start - self.origin, end - start, " ".join("x".join(map(str, s)) for s in call.shapes), flops,
                nbytes))
        self._pending = []

    def _costs_of(self, batch: int, accumulate: int = 1, clip: bool = False) -> dict[CallKey, KernelCost]:
        """Analytic costs of a step on ``batch`` samples (in ``accumulate`` micro-batches; with
        ``clip``, clipping the gradient), by the call they pair with."""
        if (batch, accumulate, clip) not in self._costs:
            self._costs[batch, accumulate, clip] = keyed_costs(step_costs(self.network, self.trainer.optimizer,
                                                                          batch // accumulate, accumulate, clip))
        return self._costs[batch, accumulate, clip]
