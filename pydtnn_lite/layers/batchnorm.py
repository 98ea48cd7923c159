"""Batch normalisation with statistics taken over the whole global batch."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pydtnn_lite import kernels
from pydtnn_lite.backend import Backend, array_module
from pydtnn_lite.costs import ALLREDUCE, KernelCost, Stage, fused_cost
from pydtnn_lite.errors import UserError
from pydtnn_lite.kernels.normalization import shifted_sums
from pydtnn_lite.layers.activation import ACTIVATIONS, relu_costs
from pydtnn_lite.layers.base import Layer, Shape, StepContext
from pydtnn_lite.layers.merge import Concat


class BatchNorm(Layer):
    """Per-channel normalisation; gamma and beta trained, running mean and variance kept.

    In training the statistics are those of the global batch (the local sums of every
    rank are added), so they, the gradients and the running statistics are identical on
    every rank and equal to a single-process run. The mean and variance are accumulated
    in float64 about a shared shift, so float32 inputs far from zero keep their variance.
    Running statistics follow PyTorch:
    ``running = (1 - momentum) * running + momentum * batch`` with the unbiased variance.

    ``activation="relu"`` applies a ReLU to the output, fused into the layer's kernels: the
    forward writes the activated output in the pass that normalises, and the backward masks
    the upstream gradient by ``out > 0`` as it reads it, so BatchNorm followed by ReLU makes
    the memory passes of BatchNorm alone. The mask is computed again from the input, as the
    forward computed the output, rather than read from the kept output.
    """

    kind = "bn"
    sums_input_grads = True

    def __init__(self, momentum: float = 0.1, eps: float = 1e-5, activation: str | None = None) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise UserError(f"BatchNorm activation {activation!r} is none of {ACTIVATIONS}")
        self.momentum, self.eps, self.activation = momentum, eps, activation
        # In a dense block, the batch norm whose input is this one's leading channels
        # (:func:`link_statistics`): its local sums stand for those channels.
        self.statistics_from: BatchNorm | None = None
        self.statistics_to: BatchNorm | None = None
        self._handed_sums: tuple[Any, tuple] | None = None  # (this step's local sums, input shape) for statistics_to

    def init(self, input_shapes: Sequence[Shape], backend: Backend, rng: np.random.Generator) -> Shape:
        channels = input_shapes[0][-1]
        xp = backend.xp
        self.params["gamma"] = xp.ones(channels, dtype=backend.dtype)
        self.params["beta"] = xp.zeros(channels, dtype=backend.dtype)
        self.buffers["running_mean"] = xp.zeros(channels, dtype=backend.dtype)
        self.buffers["running_var"] = xp.ones(channels, dtype=backend.dtype)
        return tuple(input_shapes[0])

    def forward(self, x: Any, ctx: StepContext) -> Any:
        gamma, beta = self.params["gamma"], self.params["beta"]
        if not ctx.training:
            out = kernels.batchnorm_inference(x, gamma, beta, self.buffers["running_mean"],
                                              self.buffers["running_var"], self.eps)
            return kernels.relu(out) if self.activation else out
        xp = array_module(x)
        # Every rank holds the same running mean: a shift they share, close to the batch
        # mean after the first steps, so the float64 sums below barely cancel.
        shift = self.buffers["running_mean"].astype(xp.float64)
        local = self._local_sums(x)
        sums = ctx.sum_across_ranks(shifted_sums(local, int(np.prod(x.shape[:-1])), shift))
        self.rows = ctx.global_batch * int(np.prod(x.shape[1:-1]))
        offset = sums[0] / self.rows
        mean = shift + offset
        var = xp.maximum(sums[1] / self.rows - offset * offset, 0.0)
        # Kept for the backward, which normalises x again as it reads it.
        self.x, self.mean = x, mean.astype(x.dtype)
        self.inv_std = (1.0 / xp.sqrt(var + self.eps)).astype(x.dtype)
        normalize = kernels.batchnorm_relu_normalize if self.activation else kernels.batchnorm_normalize
        out = normalize(x, self.mean, self.inv_std, gamma, beta)
        unbiased = var * (self.rows / max(self.rows - 1, 1))
        m = self.momentum
        self.buffers["running_mean"][...] = (1 - m) * self.buffers["running_mean"] + m * mean
        self.buffers["running_var"][...] = (1 - m) * self.buffers["running_var"] + m * unbiased
        self.sum_across_ranks = ctx.sum_across_ranks
        return out

    def _local_sums(self, x: Any) -> Any:
        """:func:`~pydtnn_lite.kernels.normalization.batchnorm_sums` of ``x``, reading only the
        channels that the linked earlier batch norm did not sum this step."""
        known = self._take_known_sums(x)
        local = kernels.batchnorm_sums(x if known is None else x[..., known.shape[1]:])
        if known is not None:
            local = array_module(local).concatenate([known, local], axis=1)
        if self.statistics_to is not None:
            self._handed_sums = (local, x.shape)
        return local

    def _take_known_sums(self, x: Any) -> Any | None:
        earlier = self.statistics_from
        if earlier is None or earlier._handed_sums is None:
            return None
        (sums, summed), earlier._handed_sums = earlier._handed_sums, None
        # The earlier input of this step, as many rows as this one, and fewer channels.
        fits = summed[:-1] == x.shape[:-1] and summed[-1] < x.shape[-1]
        return sums if fits else None

    def backward(self, grad_out: Any) -> Any:
        return self.backward_summing(grad_out, None)

    def backward_summing(self, grad_out: Any, addend: Any) -> Any:
        normalization = (self.x, self.mean, self.inv_std)
        gamma, beta = self.params["gamma"], self.params["beta"]
        local = (kernels.batchnorm_relu_grad_sums(grad_out, *normalization, gamma, beta) if self.activation
                 else kernels.batchnorm_grad_sums(grad_out, *normalization))
        # Parameter gradients stay local (the gradient Allreduce adds them); the input
        # gradient needs the all-rank sums.
        self.grads["beta"][...] = local[0]
        self.grads["gamma"][...] = local[1]
        grad_in = None
        if self.needs_input_grad:
            total = self.sum_across_ranks(local)
            grad_in = (kernels.batchnorm_relu_grad_input(grad_out, *normalization, gamma, beta, total, self.rows,
                                                         addend)
                       if self.activation
                       else kernels.batchnorm_grad_input(grad_out, *normalization, gamma, total, self.rows, addend))
        self.x = None
        return grad_in

    def describe(self) -> str:
        return f"+{self.activation}" if self.activation else ""

    def costs(self, batch: int) -> list[KernelCost]:
        """The kernels, and the reductions over the ranks of the per-channel sums (2 x C
        values each; a job of one rank reduces nothing), in the order they run."""
        n = self.elements(batch)
        s = self.itemsize
        shape = tuple(self.output_shape)
        dims = (batch,) + (1,) * (3 - len(shape)) + shape  # (batch, H, W, C); a vector is a 1x1 map
        sums, grad_sums = 2 * shape[-1] * 8, 2 * shape[-1] * s  # the statistics are float64
        # Two passes over the channels not summed already: the mean, then the squared deviations.
        known = self.statistics_from.output_shape[-1] if self.statistics_from is not None else 0
        summed = n // shape[-1] * (shape[-1] - known)
        out = [KernelCost(Stage.FP, "batchnorm_sums", 4 * summed, 2 * summed * s, dims[:-1] + (shape[-1] - known,)),
               KernelCost(Stage.FP, ALLREDUCE, 0.0, sums, (sums,))]
        # The backward calls normalise x again (2 FLOPs an element) rather than read a stored x_hat.
        normalize = KernelCost(Stage.FP, "batchnorm_normalize", 4 * n, 2 * n * s, dims)
        grad_sums_call = KernelCost(Stage.BP, "batchnorm_grad_sums", 5 * n, 2 * n * s, dims)
        # Adding the input's other gradients in reads one array more (and saves the network's add).
        added = self.adds_input_grad
        grad_input = KernelCost(Stage.BP, "batchnorm_grad_input", (7 + added) * n, (3 + added) * n * s, dims)
        if self.activation:
            # The fused calls read and write what the batch-norm calls do; the ReLU costs one
            # FLOP an element, and the backward calls three more to compute its mask again.
            relu, relu_grad = relu_costs(n, s)
            normalize = fused_cost("batchnorm_relu_normalize", 5 * n, 2 * n * s, dims, [normalize, relu])
            grad_sums_call = fused_cost("batchnorm_relu_grad_sums", 8 * n, 2 * n * s, dims,
                                        [relu_grad, grad_sums_call])
            grad_input = fused_cost("batchnorm_relu_grad_input", (10 + added) * n, (3 + added) * n * s, dims,
                                    [grad_input])
        out += [normalize, grad_sums_call]
        if self.needs_input_grad:
            out += [KernelCost(Stage.BP, ALLREDUCE, 0.0, grad_sums, (grad_sums,)), grad_input]
        return out


def link_statistics(layers: Sequence[Layer], sources: Sequence[Sequence[int]]) -> None:
    """Link each batch norm whose input is a concatenation to the batch norm that reads the
    concatenation's first input, where that one runs earlier and is not linked yet (a
    dense block: each layer's first batch norm reads the block so far, and the next one
    reads it with the new features appended). The later one then takes the earlier's local
    sums for those channels and sums only the new ones: the same statistics, a fraction of
    the reading."""
    readers: dict[int, BatchNorm] = {}
    for layer, inputs in zip(layers, sources, strict=True):
        if isinstance(layer, BatchNorm):
            readers.setdefault(inputs[0], layer)
    for layer, inputs in zip(layers, sources, strict=True):
        joined = layers[inputs[0]] if inputs[0] >= 0 else None
        if not isinstance(layer, BatchNorm) or not isinstance(joined, Concat):
            continue
        earlier = readers.get(sources[inputs[0]][0])
        if earlier is not None and earlier.index < layer.index and earlier.statistics_to is None:
            layer.statistics_from, earlier.statistics_to = earlier, layer
