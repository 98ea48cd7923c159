"""What optimizers share: state arrays shaped like the flat parameters, updated per layer."""
from __future__ import annotations

from typing import Any

import numpy as np

from pydtnn_lite.costs import KernelCost, Stage
from pydtnn_lite.network import Network


class Optimizer:
    """Updates a built network's flat parameters from its flat gradients, one layer segment at a time.

    Subclasses name their per-parameter state arrays in ``state_names``, the kernel they
    call in ``kernel``, and implement :meth:`update_segment`. Each layer's update runs in
    the network's scope of that layer, so a tracer attributes WU time to layers.
    """

    state_names: tuple[str, ...] = ()
    kernel = ""
    flops_per_element = 0
    arrays_touched = 0  # arrays read or written per element, for the bytes estimate
    state_arrays_touched = 0  # of those, the optimizer state's: the rest are the parameter's and the gradient's

    def __init__(self, network: Network) -> None:
        self.network = network
        xp = network.backend.xp
        self.state = {name: xp.zeros_like(network.flat_params) for name in self.state_names}
        self.steps = 0

    @property
    def state_byte_share(self) -> float:
        """The share of an update's bytes that are its optimizer state's."""
        return self.state_arrays_touched / self.arrays_touched if self.arrays_touched else 0.0

    def step(self, lr: float) -> None:
        """Apply one update with learning rate ``lr`` to every parameter."""
        self.steps += 1
        for segment in self.network.segments:
            window = slice(segment.start, segment.stop)
            with self.network.scope(segment.layer, Stage.WU):
                self.update_segment(self.network.flat_params[window], self.network.flat_grads[window],
                                    {name: array[window] for name, array in self.state.items()}, lr)

    def update_segment(self, params: Any, grads: Any, state: dict[str, Any], lr: float) -> None:
        raise NotImplementedError

    def costs(self) -> list[tuple[int, KernelCost]]:
        """(layer index, cost) of the WU kernel of every layer with parameters; the first
        follows the step's other work (``KernelCost.cold_start``)."""
        itemsize = np.dtype(self.network.backend.dtype).itemsize
        out = []
        for index, segment in enumerate(self.network.segments):
            n = segment.stop - segment.start
            out.append((segment.layer, KernelCost(Stage.WU, self.kernel, self.flops_per_element * n,
                                                  self.arrays_touched * n * itemsize, (n,), cold_start=index == 0)))
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies of the optimizer state, for checkpoints."""
        to_host = self.network.backend.to_host
        out = {name: to_host(array).copy() for name, array in self.state.items()}
        out["steps"] = np.array(self.steps)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, array in self.state.items():
            array[...] = self.network.backend.asarray(state[name])
        self.steps = int(state["steps"])
