"""Training step time with the zoo's pool-then-ReLU order against the textbook ReLU-then-pool order.

    python benchmarks/pool_relu_order.py [--model vgg11] [--batch-size 64] [--threads 2] [--steps 10]

Two trainers of the same network and weights, one as the zoo builds it (each max pool
before the ReLU that precedes it in the textbook, ``models/blocks.py``), one with those
pairs swapped back; their steps on one fixed batch alternate, so a shared machine's load
hits both alike. Prints each median step time, the time inside the ReLU and pooling
kernels, and the ratios.
"""
from __future__ import annotations

from collections.abc import Callable

from pydtnn_lite.comm import SerialCommunicator
from pydtnn_lite.models.blocks import relu_before_pools
from pydtnn_lite.runtime import set_blas_threads
from pydtnn_lite.training import Trainer

from common import interleave, kernel_timed_step, make_trainer, model_parser, print_step_comparison

MOVED_KERNELS = ("relu", "relu_grad", "maxpool", "maxpool_grad")


def main() -> None:
    parser = model_parser(__doc__)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    set_blas_threads(args.threads)

    def variant(name: str, trainer: Trainer) -> Callable[[], dict[str, float]]:
        return kernel_timed_step(name, trainer, trainer.load_step(0, 0),
                                 lambda entry, kernel: kernel if entry in MOVED_KERNELS else None)

    def trainer(arrange: Callable = lambda network: network) -> Trainer:
        return make_trainer(args.model, args.dataset, args.batch_size, SerialCommunicator(), arrange=arrange)

    samples = interleave([variant("pool first", trainer()), variant("relu first", trainer(relu_before_pools))],
                         rounds=args.steps, warmup=2)
    print_step_comparison(args, samples, "relu first", "pool first", "ReLU and max pooling")


if __name__ == "__main__":
    main()
