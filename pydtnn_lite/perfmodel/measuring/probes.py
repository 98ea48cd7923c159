"""The calibration grid: small networks whose training steps run every kernel over a range of shapes.

A :class:`Probe` is one grid point: a family of network, its shape parameters, a batch
size and an optimizer. Its network is a few layers around the layer of interest, chosen
so that one training step runs each kernel of that layer (a layer with parameters comes
first, so that even the first convolution computes its input gradient) and ends in a
Dense head, a loss and an update, which are sampled too.

The shape ranges follow Table 3 of Barrachina et al. (2021), scaled down so that a full
calibration runs in minutes on a few cores; the grid is a seeded random subset of their
product, under a budget of FLOPs per training step.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from pydtnn_lite.backend import Backend
from pydtnn_lite.data import GENERATED_SHAPES, DataError
from pydtnn_lite.kernels.conv import output_size
from pydtnn_lite.layers import (
    Add,
    AvgPool2D,
    BatchNorm,
    Concat,
    Conv2D,
    Dense,
    Dropout,
    Flatten,
    GlobalAvgPool2D,
    MaxPool2D,
    ReLU,
)
from pydtnn_lite.layers.conv import convolution_form
from pydtnn_lite.models import create_model
from pydtnn_lite.network import Network
from pydtnn_lite.optim import SGD, Adam, Optimizer

CLASSES = (10, 100, 1000)  # the head's width: the loss kernels' (batch, classes)
SIZES = (4, 8, 16, 32)  # feature map height = width
CHANNELS = (3, 16, 64, 128, 256, 512)
FILTERS = (6, 16, 64, 128, 256, 512)  # 6: a LeNet-sized GEMM of a few columns, far below the wide ones' rate
LONG_PRODUCT_FILTERS = (6, 16, 64)  # LeNet's and VGG's first layers
KERNELS = (1, 3, 5)
STRIDES = (1, 2)
WIDTHS = (64, 256, 512, 1024, 2048, 4096)  # Dense inputs and outputs
MAX_DENSE_WEIGHTS = 1 << 22  # larger weight matrices take longer to initialise than to time
POOLS = ((2, 2, 0), (3, 2, 1), (3, 1, 1), (2, 1, 0))  # (window, stride, padding)
MERGE_CHANNELS = (16, 64, 128, 256)


@dataclass(frozen=True)
class Probe:
    """One grid point. ``family`` is conv, dense, pool, merge or residual; ``shape`` its parameters:

    - conv: (size, in channels, filters, kernel, stride, padding);
    - dense: (inputs, units, classes);
    - pool: (size, channels, window, stride, padding);
    - merge and residual: (size, channels).

    Or, off the grid, a job's own network: family model, ``shape`` (zoo model name, the
    generated data set whose shapes it takes), its calls sampled at their exact sizes.
    """

    family: str
    batch: int
    shape: tuple
    optimizer: str = "sgd"

    @property
    def input_shape(self) -> tuple:
        if self.family == "model":
            return tuple(GENERATED_SHAPES[self.shape[1]][0])
        if self.family == "dense":
            return (self.shape[0],)
        return (self.shape[0], self.shape[0], self.shape[1])

    @property
    def classes(self) -> int:
        if self.family == "model":
            return GENERATED_SHAPES[self.shape[1]][1]
        return self.shape[2] if self.family == "dense" else CLASSES[0]

    def activations(self) -> int:
        """Elements of the probe's input batch: what its element-wise kernels scale with."""
        return self.batch * int(np.prod(self.input_shape))

    def step_flops(self) -> float:
        """FLOPs of the GEMMs of one training step (the rest is small next to them)."""
        if self.family == "conv":
            size, c_in, filters, kernel, stride, padding = self.shape
            pixels = output_size(size, kernel, stride, padding) ** 2
            return 6.0 * self.batch * pixels * filters * kernel * kernel * c_in
        if self.family == "dense":
            inputs, units, classes = self.shape
            return 6.0 * self.batch * units * (inputs + classes)
        return 0.0

    def trainable(self, backend: Backend, seed: int = 0) -> tuple[Network, Optimizer]:
        """The probe's network built on ``backend``, and its optimizer."""
        network = self.network().build(backend, seed=seed)
        return network, Adam(network) if self.optimizer == "adam" else SGD(network)

    def network(self) -> Network:
        """The probe's network, not yet built."""
        if self.family == "model":
            return create_model(self.shape[0], self.input_shape, self.classes)
        net = Network(f"probe-{self.family}", self.input_shape, self.classes)
        # Parameters before the layer of interest, so that it computes its input gradient.
        first = net.add(BatchNorm())
        if self.family == "conv":
            _, _, filters, kernel, stride, padding = self.shape
            net.add(Conv2D(filters, kernel, stride=stride, padding=padding))
            # After a layer with parameters, both batch norms compute their input gradients:
            # the fused kernels and the unfused ones over the same shapes.
            net.add(BatchNorm(activation="relu"))
            net.add(BatchNorm())
            net.add(ReLU())
        elif self.family == "dense":
            net.add(Dense(self.shape[1]))
            net.add(ReLU())
            net.add(Dropout(0.5))
        elif self.family == "pool":
            _, _, window, stride, padding = self.shape
            net.add(MaxPool2D(window, stride=stride, padding=padding))
            net.add(AvgPool2D(window, stride=stride, padding=padding))
        elif self.family == "merge":  # a shortcut and a concatenation, so backward also sums gradients
            activation = net.add(ReLU(), first)
            total = net.add(Add(), activation, first)
            net.add(Concat(), total, first)
            net.add(Dropout(0.5))
        else:  # residual: a ReLU, and an Add with its ReLU fused in (a residual block's output), each
            # feeding two shortcuts, sum their gradients
            activation = net.add(ReLU(), first)
            block_output = net.add(Add(activation="relu"), activation, first)
            net.add(Add(), net.add(Add(), block_output, activation), block_output)
        if self.family != "dense":
            net.add(GlobalAvgPool2D())
            net.add(Flatten())
        net.add(Dense(self.classes))
        return net


def _pool_fits(size: int, window: int, stride: int, padding: int) -> bool:
    """A max pool then an average pool of the same window both fit a ``size`` map."""
    once = output_size(size, window, stride, padding)
    return once >= 1 and output_size(once, window, stride, padding) >= 1 and 2 * padding < window


def _candidates(family: str, batch_sizes: Sequence[int]) -> Iterator[Probe]:
    """Every valid grid point of ``family`` (before sampling)."""
    if family == "conv":
        for batch, size, c_in, filters, kernel, stride in itertools.product(
                batch_sizes, SIZES, CHANNELS, FILTERS, KERNELS, STRIDES):
            for padding in sorted({0, kernel // 2}):
                if output_size(size, kernel, stride, padding) >= 1:
                    yield Probe("conv", batch, (size, c_in, filters, kernel, stride, padding))
    elif family == "dense":
        for batch, inputs, units, classes in itertools.product(batch_sizes, WIDTHS, WIDTHS, CLASSES):
            if inputs * units <= MAX_DENSE_WEIGHTS:
                yield Probe("dense", batch, (inputs, units, classes))
    elif family == "pool":
        # Few channels too: the window loops then cost more per byte (LeNet pools 6 channels).
        for batch, size, channels, (window, stride, padding) in itertools.product(
                batch_sizes, SIZES, CHANNELS, POOLS):
            if _pool_fits(size, window, stride, padding):
                yield Probe("pool", batch, (size, channels, window, stride, padding))
    else:
        for batch, size, channels in itertools.product(batch_sizes, SIZES, MERGE_CHANNELS):
            yield Probe(family, batch, (size, channels))


def _conv_form(probe: Probe) -> str:
    size, c_in, filters, kernel, stride, padding = probe.shape
    out = output_size(size, kernel, stride, padding)
    return convolution_form(c_in, filters, kernel, stride, (out, out), probe.batch)


def _missing_forms(chosen: list[Probe], candidates: list[Probe]) -> list[Probe]:
    """The cheapest candidate of each convolution form that no ``chosen`` probe computes in:
    each form runs kernels of its own (the Winograd form's tile transforms), which every
    calibration must sample, however few probes it draws and however small its limits (a
    quick grid's admit no batch of 32 Winograd tiles)."""
    drawn = {_conv_form(probe) for probe in chosen}
    cheapest: dict[str, Probe] = {}
    for probe in sorted(candidates, key=Probe.step_flops):
        cheapest.setdefault(_conv_form(probe), probe)
    return [probe for form, probe in sorted(cheapest.items()) if form not in drawn]


def _long_products(batch_sizes: Sequence[int]) -> list[Probe]:
    """Input layers (3 channels, few filters) over maps twice the grid's largest, at its two
    largest batches. A first layer's weight gradient sums over batch x pixels: 131072 terms
    for LeNet at 128 images a rank, twice what the grid's maps reach, and a product of a
    few columns slows down there as its operands leave the caches (LeNet's (75 x 131072)
    by (131072 x 6) took 16-19 ms where the grid's samples predicted 10.6)."""
    size = 2 * max(SIZES)
    return [Probe("conv", batch, (size, 3, filters, kernel, 1, padding))
            for batch in sorted(batch_sizes)[-2:] for filters in LONG_PRODUCT_FILTERS
            for kernel in (3, 5) for padding in (0, kernel // 2)]


@dataclass(frozen=True)
class GridSize:
    """How much of the grid to run: probes per family, and the largest training step
    (GEMM FLOPs, and elements of the input batch) a drawn probe may have (the cheapest
    probe of a convolution form the draw missed is added whatever its size), and whether
    the probes of :func:`_long_products` are added."""

    points: dict
    max_step_flops: float
    max_activations: int
    long_products: bool = True


# Sized to calibrate in minutes on 2 cores (docs/performance-model.md, 'How well the models
# fit here'); covers the layers of VGG11 and ResNet18 at batch 64 on CIFAR-sized images
# (up to 512 channels).
FULL = GridSize({"conv": 300, "dense": 48, "pool": 96, "merge": 64, "residual": 32}, 8e9, 1 << 22)
QUICK = GridSize({"conv": 6, "dense": 4, "pool": 3, "merge": 3, "residual": 2}, 5e7, 1 << 16, long_products=False)


def calibration_grid(batch_sizes: Sequence[int], size: GridSize, seed: int = 0) -> list[Probe]:
    """``size.points[family]`` probes of each family, drawn with ``seed`` from the valid grid
    points within the size's limits, and for conv the probes of :func:`_missing_forms` (and
    of :func:`_long_products` where the size asks) whatever the limits. Dense probes
    alternate between SGD and Adam, so both update kernels are sampled."""
    rng = np.random.default_rng(seed)
    grid: list[Probe] = []
    for family, count in size.points.items():
        valid = list(_candidates(family, batch_sizes))
        candidates = [p for p in valid
                      if p.step_flops() <= size.max_step_flops and p.activations() <= size.max_activations]
        picks = rng.choice(len(candidates), size=min(count, len(candidates)), replace=False)
        chosen = [candidates[i] for i in sorted(picks)]
        if family == "conv":
            chosen += _missing_forms(chosen, valid) + (_long_products(batch_sizes) if size.long_products else [])
        if family == "dense":
            chosen = [Probe(p.family, p.batch, p.shape, "adam" if i % 2 else "sgd") for i, p in enumerate(chosen)]
        grid += chosen
    return grid


def job_probes(jobs: Sequence[tuple[str, int, str]]) -> list[Probe]:
    """A probe per (zoo model, batch per rank, generated data set): the job's own network,
    so that each of its calls is sampled at its exact sizes. Raises UserError for a model
    or data set that is not known."""
    probes = []
    for model, batch, dataset in jobs:
        if dataset not in GENERATED_SHAPES:
            raise DataError(f"--models {model}:{batch}:{dataset}: the data set must be one made here "
                            f"({', '.join(GENERATED_SHAPES)}), whose shapes need no files")
        probe = Probe("model", batch, (model, dataset))
        probe.network()  # an unknown model is refused here, before anything is measured
        probes.append(probe)
    return probes
