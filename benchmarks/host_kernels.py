"""Training step time with the compiled kernels against the array-library versions they replace.

    python benchmarks/host_kernels.py [--model resnet18] [--batch-size 64] [--threads 2] [--steps 10]
        [--optimizer sgd|adam] [--clip-grad-norm MAX] [--device cpu|gpu] [--kernels PREFIX...]

One trainer, one fixed batch; the steps alternate between the kernel entries as shipped
(on the host: Numba for im2col, col2im, the Winograd tile transforms, batch norm (fused
with ReLU or not), ReLU, add, pooling, the SGD and Adam updates, the sum of micro-batch
gradients and the gradient's norm and scaling (``--clip-grad-norm``); on a GPU: CUDA for
im2col, col2im, pooling and batch norm) and the same entries pointed at the functions
written with the array library's operators (NumPy's, or CuPy's on a GPU), so a shared
machine's load hits both alike. ``--kernels batchnorm`` replaces only the entries whose
names start so. Prints each median step time, the time inside those kernels (on the host
only: a GPU's launches return before the kernels run), and the speed-up.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pydtnn_lite.comm import SerialCommunicator
from pydtnn_lite.kernels import conv, elementwise, normalization, pooling, update, winograd
from pydtnn_lite.runtime import set_blas_threads

from common import interleave, kernel_timed_step, make_trainer, model_parser

NUMPY_VERSIONS = {
    "im2col": conv.im2col, "col2im": conv.col2im, "relu": elementwise.relu, "relu_grad": elementwise.relu_grad,
    "add": elementwise.add, "batchnorm_sums": normalization.batchnorm_sums,
    "batchnorm_normalize": normalization.batchnorm_normalize,
    "batchnorm_grad_sums": normalization.batchnorm_grad_sums,
    "batchnorm_grad_input": normalization.batchnorm_grad_input,
    "batchnorm_relu_normalize": normalization.batchnorm_relu_normalize,
    "batchnorm_relu_grad_sums": normalization.batchnorm_relu_grad_sums,
    "batchnorm_relu_grad_input": normalization.batchnorm_relu_grad_input, "maxpool": pooling.maxpool,
    "maxpool_grad": pooling.maxpool_grad, "avgpool": pooling.avgpool, "avgpool_grad": pooling.avgpool_grad,
    "sgd_update": update.sgd_update, "adam_update": update.adam_update,
    "start_gradient_sum": update.start_gradient_sum, "accumulate_gradients": update.accumulate_gradients,
    "gradient_norm": update.gradient_norm,
    "scale_gradient": update.scale_gradient,
    "winograd_filter": winograd.filter_tiles, "winograd_filter_grad": winograd.filter_tiles_grad,
    "winograd_input": winograd.input_tiles, "winograd_output": winograd.output_tiles,
    "winograd_output_grad": winograd.output_tiles_grad, "winograd_input_grad": winograd.input_tiles_grad,
}


def main() -> None:
    parser = model_parser(__doc__)
    parser.set_defaults(model="resnet18")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--clip-grad-norm", type=float, default=None, metavar="MAX",
                        help="clip the gradient to this norm each step, as train's flag")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--kernels", nargs="+", default=[""], metavar="PREFIX",
                        help="replace only the entries whose names start with one of these (default: all)")
    args = parser.parse_args()
    chosen = {entry for entry in NUMPY_VERSIONS if entry.startswith(tuple(args.kernels))}
    if not chosen:
        parser.error(f"no kernel entry starts with {' or '.join(args.kernels)}: "
                     f"choose from {', '.join(NUMPY_VERSIONS)}")
    set_blas_threads(args.threads)
    trainer = make_trainer(args.model, args.dataset, args.batch_size, SerialCommunicator(), device=args.device,
                           optimizer=args.optimizer, clip_grad_norm=args.clip_grad_norm)
    batch = trainer.load_step(0, 0)

    def variant(name: str, pick: Callable[[str, Callable], Callable]) -> Callable[[], dict[str, float]]:
        return kernel_timed_step(name, trainer, batch,
                                 lambda entry, kernel: pick(entry, kernel) if entry in chosen else None)

    on_host = args.device == "cpu"
    compiled, reference = ("numba", "numpy") if on_host else ("cuda", "cupy")
    samples = interleave([variant(compiled, lambda entry, kernel: kernel),
                          variant(reference, lambda entry, kernel: NUMPY_VERSIONS[entry])],
                         rounds=args.steps, warmup=2)
    median = {name: float(np.median(values)) for name, values in samples.items()}
    print(f"{args.model} on {args.dataset}, batch {args.batch_size}, {args.device}, {args.threads} threads, "
          f"{args.optimizer} (medians of {args.steps} steps each, interleaved); {len(chosen)} kernel entries replaced")
    for name in (reference, compiled):
        inside = f", of which the replaced kernels {median[name + ' kernels'] * 1e3:.1f} ms" if on_host else ""
        print(f"{name:6s} kernels: step {median[name] * 1e3:.1f} ms{inside}")
    inside = (f", replaced kernels {median[reference + ' kernels'] / median[compiled + ' kernels']:.2f}x"
              if on_host else "")
    print(f"speed-up: step {median[reference] / median[compiled]:.2f}x{inside}")


if __name__ == "__main__":
    main()
