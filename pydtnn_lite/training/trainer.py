"""Synchronous data-parallel training: the step, the epoch loop and evaluation.

Every rank runs this same code on its own share of each global batch. The loss gradient
is divided by the global batch size, so the SUM Allreduce of the gradients is the
gradient of the full-batch mean loss, and every rank applies the identical update.
"""
from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pydtnn_lite import kernels
from pydtnn_lite.comm import Communicator, GradientSynchronizer, SerialCommunicator, make_gradient_synchronizer
from pydtnn_lite.costs import NO_LAYER
from pydtnn_lite.data import Augmentation, Dataset, EpochSampler, local_rows
from pydtnn_lite.data.prefetch import Prefetcher
from pydtnn_lite.layers import SoftmaxCrossEntropy, StepContext
from pydtnn_lite.network import Network
from pydtnn_lite.optim import SGD, LearningRateSchedule, Optimizer, clip_by_global_norm
from pydtnn_lite.training.balance import LoadBalancer
from pydtnn_lite.training.divergence import DivergenceGuard
from pydtnn_lite.training.observer import DATA_LOAD, EVAL, H2D_COPY, NO_OBSERVER, TRAIN, TrainingObserver


@dataclass
class StepResult:
    """Global (all-rank) figures of one step or one evaluation."""

    loss: float
    accuracy: float
    samples: int
    seconds: float = 0.0


@dataclass(frozen=True)
class Batch:
    """This rank's rows of one global batch, on the backend's device.

    ``global_size`` is the whole global batch (all ranks) and ``offset`` the position of
    this rank's first row in it: layers that draw per sample (dropout) need both. A batch
    of a step that accumulates gradients holds the rank's rows of each micro-batch in
    turn: ``parts`` gives each one's (rows of this rank, position of its first row in the
    global batch); None is one part of all the rows at ``offset``. ``read_seconds`` is how
    long a batch read ahead took to read on the loader thread (0 for one read in the step,
    whose time already holds it).
    """

    images: Any
    labels: Any
    global_size: int
    offset: int
    parts: tuple[tuple[int, int], ...] | None = None
    read_seconds: float = 0.0

    def micro_batches(self) -> list[tuple[Any, Any, int]]:
        """(images, labels, offset in the global batch) of each micro-batch."""
        if self.parts is None:
            return [(self.images, self.labels, self.offset)]
        pieces, first = [], 0
        for rows, offset in self.parts:
            pieces.append((self.images[first:first + rows], self.labels[first:first + rows], offset))
            first += rows
        return pieces

    @property
    def samples(self) -> int:
        """Rows of this rank."""
        return len(self.images)


@dataclass(frozen=True)
class TrainerSettings:
    """The trainer's fixed choices.

    ``global_batch`` samples per step, all ranks together; ``share_weights`` set how it is
    split over ranks (equal by default); ``steps_per_epoch`` cuts epochs short (default:
    the whole data set); ``augmentation`` applies to training batches only; ``prefetch``
    training batches are read ahead on a background thread (0: each inside its step);
    ``accumulate`` micro-batches of ``global_batch`` samples make one step, whose
    gradients are summed before one Allreduce and one update, as a batch ``accumulate``
    times larger would (batch-norm statistics excepted: they are the micro-batch's);
    ``clip_grad_norm`` scales the summed gradient down to that global L2 norm when larger.
    """

    global_batch: int
    seed: int = 0
    steps_per_epoch: int | None = None
    share_weights: tuple[float, ...] | None = None
    augmentation: Augmentation = field(default_factory=Augmentation)
    prefetch: int = 0
    accumulate: int = 1
    clip_grad_norm: float | None = None


StepCallback = Callable[[int, StepResult], None]  # called with (global step, its result) after each step


class Trainer:
    """Trains ``network`` on this rank's share of every global batch of ``data``.

    Gradients are summed over the ranks of ``synchronizer.comm``, which is also the
    communicator of every other collective of the step. Build one with
    :func:`build_trainer`. ``observer`` is the hook point of a tracer (see
    :mod:`~pydtnn_lite.training.observer`).
    """

    def __init__(self, network: Network, optimizer: Optimizer, schedule: LearningRateSchedule,
                 synchronizer: GradientSynchronizer, data: Dataset, settings: TrainerSettings,
                 balancer: LoadBalancer | None = None) -> None:
        settings.augmentation.check(data)
        self.network, self.optimizer, self.schedule = network, optimizer, schedule
        self.synchronizer, self.data, self.settings = synchronizer, data, settings
        self.loss = SoftmaxCrossEntropy()
        self.sampler = EpochSampler(len(data), settings.global_batch * settings.accumulate, seed=settings.seed)
        self.steps_per_epoch = min(settings.steps_per_epoch or self.sampler.steps_per_epoch,
                                   self.sampler.steps_per_epoch)
        self.share_weights = list(settings.share_weights or [1.0] * self.comm.size)
        self.global_step = 0
        self.balancer = balancer
        self.rebalanced_at: int | None = None  # the global step after which the shares last changed
        self.gradient_norm = math.nan  # the last step's before clipping (with clip_grad_norm)
        self.backend = network.backend
        self.observer: TrainingObserver = NO_OBSERVER
        self.divergence = DivergenceGuard(data.num_classes)
        self._gradient_sum: Any = None  # the running sum of a step's micro-batch gradients (accumulate > 1)
        # Loss and correct predictions summed over the samples of the current epoch so far, and those samples:
        # a checkpoint keeps them, so a resumed epoch reports the mean over all of its steps.
        self.epoch_sums = [0.0, 0.0, 0.0]

    @property
    def comm(self) -> Communicator:
        """The ranks this trainer trains with (the synchronizer's)."""
        return self.synchronizer.comm

    @property
    def seed(self) -> int:
        return self.settings.seed

    @property
    def augmentation(self) -> Augmentation:
        return self.settings.augmentation

    # ----------------------------------------------------------------- one step
    def local_rows(self, batch_size: int) -> slice:
        """This rank's rows of a global batch of ``batch_size`` samples."""
        return local_rows(batch_size, self.share_weights, self.comm.rank)

    def _sum_across_ranks(self, array: Any) -> Any:
        return self.comm.allreduce(array)

    def train_step(self, batch: Batch) -> StepResult:
        """Forward, backward, gradient Allreduce and update on this rank's ``batch``.

        Returns the global loss and accuracy; raises TrainingError, before updating any
        weight, if training diverged (see :class:`DivergenceGuard`).
        """
        self.observer.step_started(TRAIN, self.global_step, batch.samples)
        try:
            return self._train_step(batch)
        finally:
            self.observer.step_finished()

    def _train_step(self, batch: Batch) -> StepResult:
        started = time.perf_counter()
        scope, loss_index = self.network.scope, self.network.loss_index
        micro_batches = batch.micro_batches()
        # One micro-batch overlaps its Allreduce with backward; several sum their gradients
        # first (backward overwrites them), then reduce them all at once.
        on_layer_done = self.synchronizer.layer_done if len(micro_batches) == 1 else None
        loss_sum = correct = 0.0
        for index, (images, labels, offset) in enumerate(micro_batches):
            ctx = StepContext(training=True, global_batch=batch.global_size, sample_offset=offset,
                              step=self.global_step, seed=self.seed, sum_across_ranks=self._sum_across_ranks)
            logits = self.network.forward(images, ctx)
            with scope(loss_index, "FP"):
                part_loss, part_correct = self.loss.forward(logits, labels, ctx)
            with scope(loss_index, "BP"):
                grad_logits = self.loss.backward()
            self.network.backward(grad_logits, on_layer_done=on_layer_done)
            loss_sum, correct = loss_sum + float(part_loss), correct + float(part_correct)
            if on_layer_done is None:
                self._accumulate(index, last=index == len(micro_batches) - 1)
        self.synchronizer.finish()
        # Every rank holds the same reduced gradient; summing each rank's sum spreads a NaN or inf to all.
        total_loss, total_correct, gradient_sum = self.comm.allreduce_host(
            [loss_sum, correct, self.backend.total(self.network.flat_grads)])
        self.divergence.check(self.global_step, total_loss / batch.global_size, gradient_sum)
        if self.settings.clip_grad_norm is not None:
            with scope(NO_LAYER, "WU"):
                self.gradient_norm = clip_by_global_norm(self.network.flat_grads, self.settings.clip_grad_norm)
        self.optimizer.step(self.schedule(self.global_step, self.steps_per_epoch))
        self.global_step += 1
        return StepResult(total_loss / batch.global_size, total_correct / batch.global_size, batch.global_size,
                          time.perf_counter() - started)

    def _accumulate(self, index: int, last: bool) -> None:
        """Sum micro-batch ``index``'s gradients, which the next backward overwrites, into a
        buffer kept from step to step; the last micro-batch's take the sum, where the
        reduction reads them."""
        gradients = self.network.flat_grads
        if self._gradient_sum is None:
            self._gradient_sum = self.backend.xp.empty_like(gradients)
        with self.network.scope(NO_LAYER, "BP"):
            if last:
                kernels.accumulate_gradients(gradients, self._gradient_sum)
            elif index == 0:
                kernels.start_gradient_sum(self._gradient_sum, gradients)
            else:
                kernels.accumulate_gradients(self._gradient_sum, gradients)

    def load_step(self, epoch: int, step: int) -> Batch:
        """This rank's rows of step ``step`` of ``epoch``, augmented and on the device.

        Loading is part of the training step that follows: the observer's step starts here.
        """
        mine, shape = self.rows_of_step(epoch, step)
        self.observer.step_started(TRAIN, self.global_step, len(mine))
        images, labels = self.observer.run(DATA_LOAD, self.data.load, mine)
        images = self.augmentation.apply(images, mine, self.seed, epoch)
        images, labels = self.observer.run(H2D_COPY, self.to_device, images, labels)
        return Batch(images, labels, *shape)

    def rows_of_step(self, epoch: int, step: int) -> tuple[np.ndarray, tuple[int, int, tuple | None]]:
        """The data-set indices of this rank's rows of step ``step`` of ``epoch``, and the
        global size, offset and micro-batch parts of its :class:`Batch`."""
        indices = self.sampler.batch(epoch, step)
        if self.settings.accumulate == 1:
            rows = self.local_rows(len(indices))
            return indices[rows], (len(indices), rows.start, None)
        size = self.settings.global_batch
        pieces, parts = [], []
        for start in range(0, len(indices), size):
            rows = self.local_rows(len(indices[start:start + size]))
            pieces.append(indices[start + rows.start:start + rows.stop])
            parts.append((rows.stop - rows.start, start + rows.start))
        return np.concatenate(pieces), (len(indices), parts[0][1], tuple(parts))

    def read_step(self, epoch: int, step: int) -> Batch:
        """This rank's rows of step ``step`` of ``epoch``, read and augmented, on the host.

        The prefetching thread calls this: it reads the shares and the data set, and
        reports to no observer.
        """
        mine, shape = self.rows_of_step(epoch, step)
        images, labels = self.data.load(mine)
        # On the host, before the copy to the device. Choices follow the samples' data-set
        # indices, not this rank's rows, so any split of the batch trains the same images.
        return Batch(self.augmentation.apply(images, mine, self.seed, epoch), labels, *shape)

    def prefetched_step(self, batches: Prefetcher[Batch]) -> Batch:
        """The next batch read ahead by ``batches``, on the device; waiting for it is part of the step."""
        self.observer.step_started(TRAIN, self.global_step, 0)
        read = next(batches)
        self.observer.done_elsewhere(DATA_LOAD, read.started, read.finished)
        host = read.item
        images, labels = self.observer.run(H2D_COPY, self.to_device, host.images, host.labels)
        return Batch(images, labels, host.global_size, host.offset, host.parts, read.finished - read.started)

    def prefetcher(self, epoch: int, first_step: int) -> Prefetcher[Batch]:
        """The batches of ``epoch`` from ``first_step`` on, read ``settings.prefetch`` steps ahead."""
        return Prefetcher(functools.partial(self.read_step, epoch), range(first_step, self.steps_per_epoch),
                          self.settings.prefetch)

    def to_device(self, images: Any, labels: Any) -> tuple[Any, Any]:
        """Copy a batch read on the host to the backend's device (queued; page-locked on a GPU)."""
        return self.backend.to_device(images), self.backend.to_device(labels, labels.dtype)

    # ----------------------------------------------------------------- epochs
    def train_epoch(self, epoch: int, callbacks: Sequence[StepCallback] = ()) -> StepResult:
        """Run the rest of ``epoch`` from the step ``global_step`` points at; call each of
        ``callbacks`` after every step. Returns the loss and accuracy over the whole epoch (its
        steps before a resume too, from :attr:`epoch_sums`) and the samples trained in this call."""
        first = self.global_step % self.steps_per_epoch
        if first == 0:
            self.epoch_sums = [0.0, 0.0, 0.0]
        sums, trained = self.epoch_sums, 0
        started = time.perf_counter()
        batches = self.prefetcher(epoch, first) if self.settings.prefetch else None
        try:
            for step in range(first, self.steps_per_epoch):
                step_started, blocked = time.perf_counter(), self.comm.blocked_seconds
                batch = self.load_step(epoch, step) if batches is None else self.prefetched_step(batches)
                result = self.train_step(batch)
                if self.balancer is not None:
                    # Read ahead, loading overlaps the step and the time between steps, so the
                    # step's own time can hide it; but a rank consumes batches no faster than
                    # its loader reads them.
                    busy = max(time.perf_counter() - step_started - (self.comm.blocked_seconds - blocked),
                               batch.read_seconds)
                    self._balance(self.balancer, batch.samples, busy)
                    if batches is not None and self.rebalanced_at == self.global_step:
                        # Batches read ahead were split by the old shares: read them again.
                        batches.close()
                        batches = self.prefetcher(epoch, step + 1)
                sums[0] += result.loss * batch.global_size
                sums[1] += result.accuracy * batch.global_size
                sums[2] += batch.global_size
                trained += batch.global_size
                for callback in callbacks:
                    callback(self.global_step, result)
        finally:
            if batches is not None:
                batches.close()
        epoch_samples = max(sums[2], 1)
        return StepResult(sums[0] / epoch_samples, sums[1] / epoch_samples, trained, time.perf_counter() - started)

    def _balance(self, balancer: LoadBalancer, samples: int, busy_seconds: float) -> None:
        """Share this rank's samples and busy time with all ranks; re-weight the shares when the balancer says so."""
        size, rank = self.comm.size, self.comm.rank
        values = [0.0] * (2 * size)
        values[rank], values[size + rank] = float(samples), busy_seconds
        totals = self.comm.allreduce_host(values)
        balancer.observe(totals[:size], totals[size:])
        proposal = balancer.propose(self.share_weights)
        if proposal is not None:
            self.share_weights, self.rebalanced_at = proposal, self.global_step

    def evaluate(self, data: Dataset, batch_size: int, max_steps: int | None = None) -> StepResult:
        """Global loss and accuracy over ``data`` (or its first ``max_steps`` batches), ranks sharing each batch."""
        self.observer.step_started(EVAL, self.global_step, 0)
        try:
            return self._evaluate(data, batch_size, max_steps)
        finally:
            self.observer.step_finished()

    def _evaluate(self, data: Dataset, batch_size: int, max_steps: int | None) -> StepResult:
        started = time.perf_counter()
        sampler = EpochSampler(len(data), batch_size, shuffle=False)
        steps = min(max_steps or sampler.steps_per_epoch, sampler.steps_per_epoch)
        loss = correct = samples = 0.0
        for step in range(steps):
            indices = sampler.batch(0, step)
            rows = self.local_rows(len(indices))
            images, labels = self.observer.run(DATA_LOAD, data.load, indices[rows])
            images, labels = self.observer.run(H2D_COPY, self.to_device, images, labels)
            ctx = StepContext(training=False, global_batch=len(indices), sample_offset=rows.start)
            logits = self.network.forward(images, ctx)
            with self.network.scope(self.network.loss_index, "FP"):
                batch_loss, batch_correct = self.loss.forward(logits, labels, ctx)
            loss += float(batch_loss)
            correct += float(batch_correct)
            samples += len(indices)
        loss, correct = self.comm.allreduce_host([loss, correct])
        samples = max(samples, 1)
        return StepResult(loss / samples, correct / samples, int(samples), time.perf_counter() - started)


def build_trainer(network: Network, data: Dataset, settings: TrainerSettings, *,
                  comm: Communicator | None = None, optimizer: Optimizer | None = None,
                  schedule: LearningRateSchedule | None = None, bucket_mb: float = 4.0, overlap: bool = True,
                  synchronizer: GradientSynchronizer | None = None,
                  balancer: LoadBalancer | None = None) -> Trainer:
    """A trainer of the built ``network`` on ``data``: the one place that wires one up.

    Gradients are summed over ``comm`` (default: this process alone) in buckets of
    ``bucket_mb`` MiB, overlapped with backward or not; or by a given ``synchronizer``,
    whose communicator is then the trainer's (give one or the other). The optimizer
    defaults to SGD with momentum, the schedule to a constant learning rate of 0.01.
    """
    if synchronizer is not None and comm is not None:
        raise ValueError("give comm or a synchronizer (which holds its communicator), not both")
    if synchronizer is None:
        synchronizer = make_gradient_synchronizer(network, comm or SerialCommunicator(), bucket_mb, overlap)
    return Trainer(network, optimizer or SGD(network), schedule or LearningRateSchedule(0.01), synchronizer, data,
                   settings, balancer)
