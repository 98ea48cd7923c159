"""The network a prediction walks: a model of the zoo on a data set's image shape, no data needed."""
from __future__ import annotations

from pydtnn_lite.backend import make_backend
from pydtnn_lite.errors import UserError
from pydtnn_lite.models import build_model
from pydtnn_lite.network import Network
from pydtnn_lite.optim import SGD, Adam, Optimizer

# (per-sample image shape, classes) of each data set the trainer reads.
DATASET_SHAPES = {
    "synthetic": ((32, 32, 3), 10), "cifar10": ((32, 32, 3), 10),
    "synthetic-imagenet": ((224, 224, 3), 1000), "imagenet": ((224, 224, 3), 1000), "npz": ((224, 224, 3), 1000),
    "mnist": ((28, 28, 1), 10), "digits": ((8, 8, 1), 10),
}


def build_workload(model: str, dataset: str, dtype: str = "float32",
                   optimizer: str = "sgd") -> tuple[Network, Optimizer]:
    """``model`` built for ``dataset``'s shapes on the CPU, with an optimizer of the given kind."""
    if dataset not in DATASET_SHAPES:
        raise UserError(f"unknown data set {dataset!r}: choose one of {', '.join(DATASET_SHAPES)}")
    shape, classes = DATASET_SHAPES[dataset]
    network = build_model(model, shape, classes, make_backend("cpu", dtype), images=f"{dataset}'s")
    # Costs depend only on the optimizer's kind; SGD without momentum allocates no state.
    return network, (Adam(network) if optimizer == "adam" else SGD(network, momentum=0.0))
