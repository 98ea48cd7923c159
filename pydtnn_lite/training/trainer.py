"""Synchronous data-parallel training: the step, the epoch loop and evaluation.

Every rank runs this same code on its own share of each global batch. The loss gradient
is divided by the global batch size, so the SUM Allreduce of the gradients is the
gradient of the full-batch mean loss, and every rank applies the identical update.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from pydtnn_lite.comm import Communicator, GradientSynchronizer
from pydtnn_lite.data import Augmentation, Dataset, EpochSampler, local_rows
from pydtnn_lite.errors import TrainingError
from pydtnn_lite.layers import SoftmaxCrossEntropy, StepContext
from pydtnn_lite.network import Network
from pydtnn_lite.optim import LearningRateSchedule, Optimizer
from pydtnn_lite.training.balance import LoadBalancer


@dataclass
class StepResult:
    """Global (all-rank) figures of one step or one evaluation."""

    loss: float
    accuracy: float
    samples: int
    seconds: float = 0.0


class Trainer:
    """Trains ``network`` on this rank's share of every global batch of ``data``.

    ``share_weights`` set how the global batch is split over ranks (equal by default).
    ``augmentation`` is applied to training batches only, never in ``evaluate``.
    ``on_step(global_step, result)`` is called after each step (progress, checkpoints).
    """

    def __init__(self, network: Network, optimizer: Optimizer, schedule: LearningRateSchedule,
                 comm: Communicator, synchronizer: GradientSynchronizer, data: Dataset,
                 global_batch: int, seed: int = 0, steps_per_epoch: Optional[int] = None,
                 share_weights: Optional[Sequence[float]] = None,
                 augmentation: Augmentation = Augmentation(), balancer: Optional[LoadBalancer] = None) -> None:
        augmentation.check(data)
        self.network, self.optimizer, self.schedule = network, optimizer, schedule
        self.comm, self.synchronizer, self.data = comm, synchronizer, data
        self.loss = SoftmaxCrossEntropy()
        self.sampler = EpochSampler(len(data), global_batch, seed=seed)
        self.steps_per_epoch = min(steps_per_epoch or self.sampler.steps_per_epoch, self.sampler.steps_per_epoch)
        self.share_weights = list(share_weights) if share_weights else [1.0] * comm.size
        self.global_step = 0
        self.seed = seed
        self.augmentation = augmentation
        self.balancer = balancer
        self.rebalanced_at: Optional[int] = None  # the global step after which the shares last changed
        self.backend = network.backend

    # ----------------------------------------------------------------- one step
    def local_rows(self, batch_size: int) -> slice:
        """This rank's rows of a global batch of ``batch_size`` samples."""
        return local_rows(batch_size, self.share_weights, self.comm.rank)

    def _sum_across_ranks(self, array: Any) -> Any:
        return self.comm.allreduce(array)

    def train_step(self, images: Any, labels: Any, global_batch: int, sample_offset: int) -> StepResult:
        """Forward, backward, gradient Allreduce and update on this rank's ``images``.

        Returns the global loss and accuracy; raises TrainingError, before updating any
        weight, if the loss is not finite.
        """
        started = time.perf_counter()
        ctx = StepContext(training=True, global_batch=global_batch, sample_offset=sample_offset,
                          step=self.global_step, seed=self.seed, sum_across_ranks=self._sum_across_ranks)
        scope, loss_index = self.network.scope, self.network.loss_index
        logits = self.network.forward(images, ctx)
        with scope(loss_index, "FP"):
            loss_sum, correct = self.loss.forward(logits, labels, ctx)
        with scope(loss_index, "BP"):
            grad_logits = self.loss.backward()
        self.network.backward(grad_logits, on_layer_done=self.synchronizer.layer_done)
        self.synchronizer.finish()
        total_loss, total_correct = self.comm.allreduce_host([float(loss_sum), float(correct)])
        if not math.isfinite(total_loss):
            raise TrainingError(f"the loss became {total_loss} at step {self.global_step}: lower --lr "
                                "(or add --warmup-epochs), and check the input data for NaN or inf")
        self.optimizer.step(self.schedule(self.global_step, self.steps_per_epoch))
        self.global_step += 1
        return StepResult(total_loss / global_batch, total_correct / global_batch, global_batch,
                          time.perf_counter() - started)

    def load_step(self, epoch: int, step: int) -> tuple[Any, Any, int, int]:
        """This rank's images and labels of step ``step`` of ``epoch``: (x, y, global batch, offset)."""
        indices = self.sampler.batch(epoch, step)
        rows = self.local_rows(len(indices))
        mine = indices[rows]
        images, labels = self.data.load(mine)
        # On the host, before the copy to the device. Choices follow the samples' data-set
        # indices, not this rank's rows, so any split of the batch trains the same images.
        images = self.augmentation.apply(images, mine, self.seed, epoch)
        images, labels = self.to_device(images, labels)
        return images, labels, len(indices), rows.start

    def to_device(self, images: Any, labels: Any) -> tuple[Any, Any]:
        """Copy a batch read on the host to the backend's device (queued; page-locked on a GPU)."""
        return self.backend.to_device(images), self.backend.to_device(labels, labels.dtype)

    # ----------------------------------------------------------------- epochs
    def train_epoch(self, epoch: int, on_step: Optional[Callable[[int, StepResult], None]] = None) -> StepResult:
        """Run the rest of ``epoch`` from the step ``global_step`` points at."""
        loss = correct = samples = 0.0
        started = time.perf_counter()
        for step in range(self.global_step % self.steps_per_epoch, self.steps_per_epoch):
            step_started, blocked = time.perf_counter(), self.comm.blocked_seconds
            images, labels, global_batch, offset = self.load_step(epoch, step)
            result = self.train_step(images, labels, global_batch, offset)
            if self.balancer is not None:
                busy = time.perf_counter() - step_started - (self.comm.blocked_seconds - blocked)
                self._balance(len(images), busy)
            loss += result.loss * global_batch
            correct += result.accuracy * global_batch
            samples += global_batch
            if on_step is not None:
                on_step(self.global_step, result)
        samples = max(samples, 1)
        return StepResult(loss / samples, correct / samples, int(samples), time.perf_counter() - started)

    def _balance(self, samples: int, busy_seconds: float) -> None:
        """Share this rank's samples and busy time with all ranks; re-weight the shares when the balancer says so."""
        size, rank = self.comm.size, self.comm.rank
        values = [0.0] * (2 * size)
        values[rank], values[size + rank] = float(samples), busy_seconds
        totals = self.comm.allreduce_host(values)
        self.balancer.observe(totals[:size], totals[size:])
        proposal = self.balancer.propose(self.share_weights)
        if proposal is not None:
            self.share_weights, self.rebalanced_at = proposal, self.global_step

    def evaluate(self, data: Dataset, batch_size: int, max_steps: Optional[int] = None) -> StepResult:
        """Global loss and accuracy over ``data`` (or its first ``max_steps`` batches), ranks sharing each batch."""
        started = time.perf_counter()
        sampler = EpochSampler(len(data), batch_size, shuffle=False)
        steps = min(max_steps or sampler.steps_per_epoch, sampler.steps_per_epoch)
        loss = correct = samples = 0.0
        for step in range(steps):
            indices = sampler.batch(0, step)
            rows = self.local_rows(len(indices))
            images, labels = self.to_device(*data.load(indices[rows]))
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

