"""Training step time with Winograd's F(4x4, 3x3) against the patch matrix for the 3x3 stride-1 convolutions.

    python benchmarks/conv_forms.py [--model resnet18] [--batch-size 64] [--threads 2] [--steps 8]
    python benchmarks/conv_forms.py --layers 32:64:64 32:16:16 [--batch-size 64] [--threads 2] [--steps 8]

Two trainers of the same network and weights, one as the layers choose their form (the
Winograd form for 3x3 stride-1 convolutions of 64 channels or more and 32 tiles a batch or
more), one with
Winograd turned off (``Conv2D(winograd=False)``: the patch matrix, or the transposed form
for fewer filters than channels); their steps on one fixed batch alternate, so a shared
machine's load hits both alike. Prints each median step time, the time inside the
convolutions' kernels (products, patch copies, tile transforms), and the ratios.

``--layers SIZE:CHANNELS:FILTERS ...`` times single 3x3 padded convolutions instead (the
forward and the backward on a random batch, the two forms alternating), each with the
Winograd form allowed whatever its channels and tiles: where the thresholds of 64 channels,
32 tiles and 256 tiles with fewer filters than channels come from.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm import SerialCommunicator
from pydtnn_lite.layers import Conv2D, StepContext
from pydtnn_lite.layers import conv as conv_module
from pydtnn_lite.network import Network
from pydtnn_lite.runtime import keep_freed_memory, set_blas_threads
from pydtnn_lite.training import Trainer

from common import interleave, kernel_timed_step, make_trainer, model_parser, print_step_comparison, timed

CONVOLUTION_KERNELS = ("gemm", "im2col", "col2im", "winograd_filter", "winograd_filter_grad", "winograd_input",
                       "winograd_output", "winograd_output_grad", "winograd_input_grad")


def without_winograd(network: Network) -> Network:
    """``network`` (unbuilt) with every convolution's Winograd form turned off."""
    for layer in network.layers:
        if isinstance(layer, Conv2D):
            layer.winograd = False
    return network


def layer_pass(shape: str, batch: int, winograd: bool) -> tuple[str, Callable[[], dict[str, float]]]:
    """The form and a variant for :func:`interleave`: the forward and backward of one 3x3
    convolution of ``shape`` (size:channels:filters) on ``batch`` random images."""
    size, channels, filters = (int(part) for part in shape.split(":"))
    layer = Conv2D(filters, 3, padding=1, winograd=winograd)
    rng = np.random.default_rng(0)
    layer.build([(size, size, channels)], make_backend(), rng)
    x = rng.standard_normal((batch, size, size, channels), dtype=np.float32)
    grad = rng.standard_normal((batch, size, size, filters), dtype=np.float32)
    context = StepContext(training=True, global_batch=batch)
    name = f"{shape} {'allowed' if winograd else 'off'}"

    def run() -> dict[str, float]:
        return {name: timed(lambda: (layer.forward(x, context), layer.backward(grad)))}
    return layer.form(batch), run


def compare_layers(shapes: list[str], batch: int, steps: int) -> None:
    # Every shape and batch may take the form: its thresholds are what is measured.
    conv_module.WINOGRAD_MIN_CHANNELS = conv_module.WINOGRAD_MIN_TILES = conv_module.WINOGRAD_MIN_TILES_NARROW = 1
    keep_freed_memory()  # as training does: large temporaries reused, not faulted in afresh each pass
    forms, variants = {}, []
    for shape in shapes:
        for winograd in (True, False):
            forms[shape, winograd], run = layer_pass(shape, batch, winograd)
            variants.append(run)
    samples = interleave(variants, rounds=steps, warmup=2)
    median = {name: float(np.median(values)) for name, values in samples.items()}
    print(f"3x3 convolutions, padding 1, batch {batch} (medians of {steps} forward + backward passes, interleaved)")
    for shape in shapes:
        allowed, off = median[f"{shape} allowed"], median[f"{shape} off"]
        print(f"{shape}: {forms[shape, True]} {allowed * 1e3:.1f} ms, {forms[shape, False]} {off * 1e3:.1f} ms, "
              f"{allowed / off:.2f}x")


def main() -> None:
    parser = model_parser(__doc__)
    parser.set_defaults(model="resnet18")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--layers", nargs="+", metavar="SIZE:CHANNELS:FILTERS")
    args = parser.parse_args()
    set_blas_threads(args.threads)
    if args.layers:
        compare_layers(args.layers, args.batch_size, args.steps)
        return

    def variant(name: str, trainer: Trainer) -> Callable[[], dict[str, float]]:
        return kernel_timed_step(name, trainer, trainer.load_step(0, 0),
                                 lambda entry, kernel: kernel if entry in CONVOLUTION_KERNELS else None)

    def trainer(arrange: Callable[[Network], Network] = lambda network: network) -> Trainer:
        return make_trainer(args.model, args.dataset, args.batch_size, SerialCommunicator(), arrange=arrange)

    samples = interleave([variant("winograd", trainer()), variant("patch matrix", trainer(without_winograd))],
                         rounds=args.steps, warmup=2)
    print_step_comparison(args, samples, "patch matrix", "winograd", "convolution kernels")


if __name__ == "__main__":
    main()
