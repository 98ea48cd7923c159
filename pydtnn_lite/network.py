"""A network: layers wired as a directed acyclic graph, run in the order they were added.

Each layer names the layers it reads from (``Network.INPUT`` for the images), so one
flat, indexed list describes VGG's chain, ResNet's shortcuts and DenseNet's
concatenations alike; the tracer and the performance model address layers by that index.

All trainable parameters live in one flat array, and so do their gradients; each
layer's ``params`` and ``grads`` are views into them, one contiguous segment per layer in
layer order. An Allreduce bucket is then a slice of the flat gradient (no packing), and
the optimizer updates a layer's segment with one kernel call.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from pydtnn_lite import kernels
from pydtnn_lite.backend import Backend, make_backend
from pydtnn_lite.costs import KernelCost, Stage
from pydtnn_lite.layers.base import Layer, Shape, StepContext, gradient_sum_cost
from pydtnn_lite.layers.batchnorm import link_statistics
from pydtnn_lite.layers.merge import link_joins
from pydtnn_lite.textable import format_table

Scope = Callable[[int, str], AbstractContextManager]
_NO_SCOPE = nullcontext()


def no_scope(layer_index: int, stage: str) -> AbstractContextManager:
    """The default scope: nothing observes the network."""
    return _NO_SCOPE


@dataclass(frozen=True)
class Segment:
    """Where one layer's parameters sit in the flat parameter and gradient arrays."""

    layer: int
    start: int
    stop: int


class Network:
    """Layers in execution order, with their wiring, parameters and gradients.

    ``scope(layer_index, stage)`` encloses all work done for one layer in one stage
    ("FP", "BP", or "WU" by the optimizer; the loss is layer ``loss_index``). It does
    nothing by default; an observer such as the tracer replaces it to learn which layer
    and stage the kernels it times belong to, so layer code needs no hooks of its own.
    """

    INPUT = -1

    def __init__(self, name: str, input_shape: Shape, num_classes: int) -> None:
        self.name = name
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.layers: list[Layer] = []
        self.inputs: list[list[int]] = []
        self._backend: Backend | None = None
        self.scope: Scope = no_scope

    @property
    def backend(self) -> Backend:
        """The backend the network was built on (:meth:`build`)."""
        if self._backend is None:
            raise RuntimeError(f"{self.name} has no backend before build()")
        return self._backend

    # ----------------------------------------------------------------- construction
    def add(self, layer: Layer, *inputs: int) -> int:
        """Append ``layer`` reading from ``inputs`` (default: the previous layer); return its index."""
        sources = list(inputs) if inputs else [len(self.layers) - 1 if self.layers else self.INPUT]
        for source in sources:
            if not self.INPUT <= source < len(self.layers):
                raise ValueError(f"layer {len(self.layers)} reads from unknown layer {source}")
        self.layers.append(layer)
        self.inputs.append(sources)
        return len(self.layers) - 1

    def build(self, backend: Backend | None = None, seed: int = 0) -> Network:
        """Create every parameter (identically for the same seed on any device) and lay them out flat."""
        self._backend = backend or make_backend()
        rng = np.random.default_rng(seed)
        counts: dict[str, int] = {}
        needs_grad: list[bool] = []
        for index, (layer, sources) in enumerate(zip(self.layers, self.inputs, strict=True)):
            counts[layer.kind] = counts.get(layer.kind, 0) + 1
            layer.name, layer.index = f"{layer.kind}{counts[layer.kind]}", index
            shapes = [self.input_shape if s == self.INPUT else self.layers[s].output_shape for s in sources]
            layer.build(shapes, self.backend, rng)
            # An input gradient is needed only if something upstream has parameters to train.
            layer.needs_input_grad = any(s != self.INPUT and needs_grad[s] for s in sources)
            needs_grad.append(bool(layer.params) or layer.needs_input_grad)
        link_statistics(self.layers, self.inputs)
        link_joins(self.layers, self.inputs)
        for layer in self.layers:
            layer.adds_input_grad, layer.output_grad_terms = False, 1
        for index, source in self._gradient_sums():
            if self.layers[source].sums_output_grads:
                self.layers[source].output_grad_terms += 1
            else:
                layer = self.layers[index]
                layer.adds_input_grad = layer.sums_input_grads and len(self.inputs[index]) == 1
        if self.layers[-1].output_shape != (self.num_classes,):
            raise ValueError(f"{self.name}: the last layer gives {self.layers[-1].output_shape}, "
                             f"expected ({self.num_classes},) logits")
        self._flatten_parameters()
        return self

    def _flatten_parameters(self) -> None:
        xp, dtype = self.backend.xp, self.backend.dtype
        total = sum(layer.param_count for layer in self.layers)
        self.flat_params = xp.zeros(total, dtype=dtype)
        self.flat_grads = xp.zeros(total, dtype=dtype)
        self.segments: list[Segment] = []
        offset = 0
        for layer in self.layers:
            start = offset
            for name, value in list(layer.params.items()):
                size = int(np.prod(value.shape))
                self.flat_params[offset:offset + size] = value.reshape(-1)
                layer.params[name] = self.flat_params[offset:offset + size].reshape(value.shape)
                layer.grads[name] = self.flat_grads[offset:offset + size].reshape(value.shape)
                offset += size
            if offset > start:
                self.segments.append(Segment(layer.index, start, offset))

    # ----------------------------------------------------------------- computation
    def forward(self, x: Any, ctx: StepContext) -> Any:
        """Run every layer on a batch ``x`` (N, H, W, C); return the logits (N, classes)."""
        remaining = self._consumer_counts()
        outputs: dict[int, Any] = {self.INPUT: x}
        for index, (layer, sources) in enumerate(zip(self.layers, self.inputs, strict=True)):
            with self.scope(index, Stage.FP):
                outputs[index] = layer.forward(*(outputs[s] for s in sources), ctx=ctx)
            for source in sources:
                remaining[source] -= 1
                if remaining[source] == 0:
                    del outputs[source]
        return outputs[len(self.layers) - 1]

    def backward(self, grad_logits: Any, on_layer_done: Callable[[int], None] | None = None) -> None:
        """Back-propagate ``grad_logits``, filling every gradient; ``on_layer_done(i)`` follows
        layer i's backward (the communicator starts reducing its gradients there)."""
        pending: dict[int, Any] = {len(self.layers) - 1: grad_logits}
        more: dict[int, list] = {}  # further gradients of an output, for a layer that sums them itself
        for index in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[index]
            grad_out = pending.pop(index, None)
            if grad_out is None:  # nothing downstream of the images needs this layer's gradient
                continue
            with self.scope(index, Stage.BP):
                if index in more:
                    grad_in = layer.backward_of_sum([grad_out, *more.pop(index)])
                elif layer.adds_input_grad:
                    grad_in = layer.backward_summing(grad_out, pending.pop(self.inputs[index][0]))
                else:
                    grad_in = layer.backward(grad_out)
            if on_layer_done is not None:
                on_layer_done(index)
            if not layer.needs_input_grad:
                continue
            grads = grad_in if isinstance(grad_in, list) else [grad_in]
            for source, grad in zip(self.inputs[index], grads, strict=True):
                if source == self.INPUT:
                    continue
                if source in pending:  # a shortcut: sum the gradients of every consumer
                    if self.layers[source].sums_output_grads:
                        more.setdefault(source, []).append(grad)  # its backward adds them up
                        continue
                    with self.scope(source, Stage.BP):
                        grad = kernels.add((pending[source], grad))
                pending[source] = grad

    def _consumer_counts(self) -> dict[int, int]:
        counts = {self.INPUT: 0}
        for index, sources in enumerate(self.inputs):
            counts.setdefault(index, 0)
            for source in sources:
                counts[source] += 1
        counts[len(self.layers) - 1] += 1  # the caller consumes the logits
        return counts

    # ----------------------------------------------------------------- parameters
    def named_parameters(self) -> Iterator[tuple[str, Any]]:
        """(``layer.param``, array) for every trainable parameter, in layer order."""
        for layer in self.layers:
            for name, value in layer.params.items():
                yield f"{layer.name}.{name}", value

    def named_gradients(self) -> Iterator[tuple[str, Any]]:
        """(``layer.param``, gradient array), matching :meth:`named_parameters`."""
        for layer in self.layers:
            for name, value in layer.grads.items():
                yield f"{layer.name}.{name}", value

    def named_buffers(self) -> Iterator[tuple[str, Any]]:
        """(``layer.buffer``, array) for saved untrained state (batch-norm running statistics)."""
        for layer in self.layers:
            for name, value in layer.buffers.items():
                yield f"{layer.name}.{name}", value

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies of every parameter and buffer, by name."""
        to_host = self.backend.to_host
        state = {name: to_host(value).copy() for name, value in self.named_parameters()}
        state.update({name: to_host(value).copy() for name, value in self.named_buffers()})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy arrays by name into the parameters and buffers; names and shapes must match."""
        targets = dict(self.named_parameters())
        targets.update(self.named_buffers())
        missing = sorted(set(targets) - set(state))
        unexpected = sorted(set(state) - set(targets))
        if missing or unexpected:
            raise ValueError(f"weights do not fit {self.name}: missing {missing[:5]}, unexpected {unexpected[:5]}")
        for name, target in targets.items():
            value = np.asarray(state[name])
            if value.shape != tuple(target.shape):
                raise ValueError(f"weights do not fit {self.name}: {name} has shape {value.shape}, "
                                 f"expected {tuple(target.shape)}")
            target[...] = self.backend.asarray(value)

    def save(self, path: str) -> None:
        """Write every parameter and buffer to an .npz file at exactly ``path``, keyed by name."""
        with open(path, "wb") as stream:  # a file object: np.savez would append .npz to a bare name
            np.savez(stream, allow_pickle=False, **self.state_dict())

    def load(self, path: str) -> None:
        """Read weights written by :meth:`save`."""
        with np.load(path) as archive:
            self.load_state_dict({name: archive[name] for name in archive.files})

    # ----------------------------------------------------------------- description
    @property
    def param_count(self) -> int:
        return sum(layer.param_count for layer in self.layers)

    @property
    def loss_index(self) -> int:
        """The index that stands for the loss in scopes, traces and costs."""
        return len(self.layers)

    def costs(self, batch: int) -> list[tuple[int, KernelCost]]:
        """(layer index, cost) of every FP and BP kernel for a batch of ``batch`` samples:
        the layers' own and the sums of gradients where a layer's output feeds several."""
        own = [(layer.index, cost) for layer in self.layers for cost in layer.costs(batch)]
        return own + self._accumulation_costs(batch)

    def _gradient_sums(self) -> list[tuple[int, int]]:
        """(consumer, source) wherever backward meets a gradient of ``source`` from a later
        consumer as it computes ``consumer``'s, in backward's order."""
        has_grad = {len(self.layers) - 1}  # layers whose output gradient backward will compute
        out = []
        for index in range(len(self.layers) - 1, -1, -1):
            if index not in has_grad or not self.layers[index].needs_input_grad:
                continue
            for source in self.inputs[index]:
                if source == self.INPUT:
                    continue
                if source in has_grad:
                    out.append((index, source))
                has_grad.add(source)
        return out

    def _accumulation_costs(self, batch: int) -> list[tuple[int, KernelCost]]:
        """The ``add`` kernels that backward runs where gradients from several consumers meet
        (a consumer that :attr:`~pydtnn_lite.layers.base.Layer.adds_input_grad` adds them
        itself, and so does a source that :attr:`~pydtnn_lite.layers.base.Layer.sums_output_grads`)."""
        out = []
        for index, source in self._gradient_sums():
            if not self.layers[index].adds_input_grad and not self.layers[source].sums_output_grads:
                layer = self.layers[source]
                out.append((source, gradient_sum_cost(layer.elements(batch), layer.itemsize)))
        return out

    def flops_per_sample(self, stage: Stage = Stage.FP) -> float:
        """FLOPs of one sample through the given stage, counted as the textbook computation
        counts them (:meth:`Layer.direct_flops`): a Winograd convolution's as its patch matrix's."""
        accumulation = sum(cost.flops for _, cost in self._accumulation_costs(1) if cost.stage == stage)
        return sum(layer.direct_flops(1, stage) for layer in self.layers) + accumulation

    def summary(self) -> str:
        """A table of layers, output shapes, parameters and forward FLOPs per sample."""
        rows = []
        for layer, sources in zip(self.layers, self.inputs, strict=True):
            fp = layer.direct_flops(1, Stage.FP) / 1e6
            src = ",".join("in" if s == self.INPUT else str(s) for s in sources)
            rows.append((layer.index, layer.name, src, layer.output_shape, f"{layer.param_count:,}", f"{fp:.2f}",
                         layer.describe()))
        table = format_table(("#", "layer", "inputs", "output", "params", "MFLOP/sample", "details"), rows,
                             align="><<<>><")
        rule = table.split("\n")[1]  # the rule under the header closes the table too
        forward, backward = self.flops_per_sample(Stage.FP), self.flops_per_sample(Stage.BP)
        return "\n".join([f"{self.name}: input {self.input_shape}, {self.num_classes} classes", table, rule,
                          f"total parameters {self.param_count:,}; forward {forward / 1e9:.3f} GFLOP/sample; "
                          f"training step {(forward + backward) / 1e9:.3f} GFLOP/sample"])
