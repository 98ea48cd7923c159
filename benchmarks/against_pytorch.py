"""Training step time against PyTorch on the same device, the same network and batch.

    python benchmarks/against_pytorch.py [--model vgg11] [--dataset synthetic] [--batch-size 128]
        [--device cpu|gpu] [--threads 2] [--steps 10] [--channels-last] [--host-batch]

The PyTorch network is translated layer by layer from this framework's, its graph
included (the residual adds of resnet18 and resnet50, the concatenations of
densenet121), so both compute the same convolutions, poolings and products. Both run
float32 SGD steps (forward, loss, backward, update) on a fixed batch of random images;
PyTorch's TF32 is turned off, as CuPy's matmul does not use it. Prints each median step
time, this framework's throughput as a fraction of PyTorch's, and the FLOP/s each reaches
(the layers' textbook FP and BP counts over the step time, a Winograd convolution's as its
patch matrix's: an effective rate, the same count for both) against the device's float32
GEMM peak, measured in the same run: the fastest of the 2048^3 products (8192^3 on a
GPU) timed once per round between the steps; and the FLOPs this framework's kernels
execute where that is fewer.
``--dataset synthetic-imagenet`` gives ImageNet-shaped images.

This framework's step always starts from the batch in host memory (on a GPU its step
copies it into page-locked memory and on to the device). PyTorch's batch stays on the
device unless ``--host-batch``: then its step too copies the images from page-locked host
memory, as a training loop whose DataLoader pins its batches does.
"""
from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from pydtnn_lite.backend import Backend
from pydtnn_lite.comm import SerialCommunicator
from pydtnn_lite.layers import Conv2D
from pydtnn_lite.network import Network
from pydtnn_lite.runtime import set_blas_threads

from common import interleave, make_trainer, model_parser, timed


def square_product(backend: Backend, size: int) -> Callable[[], None]:
    """One ``size``-cubed float32 matrix product on the backend's device, waited for: the
    GEMM peak's measure, taken between the steps so that a slow spell cannot set it alone."""
    rng = np.random.default_rng(0)
    a, b = (backend.asarray(rng.standard_normal((size, size))) for _ in range(2))
    out = backend.xp.empty_like(a)

    def run() -> None:
        backend.xp.matmul(a, b, out=out)
        backend.synchronize()
    return run


def torch_layers(network: Network) -> list:
    """torch.nn modules computing ``network``'s layers (NCHW), in order; None for the merges
    (Add and Concat), which :class:`TorchGraph` computes itself."""
    from torch import nn

    layers: list = []
    for index, layer in enumerate(network.layers):
        sources = network.inputs[index]
        source = network.layers[sources[0]].output_shape if sources[0] != network.INPUT else network.input_shape
        if layer.kind == "conv":
            layers.append(nn.Conv2d(source[-1], layer.filters, layer.kernel_size, layer.stride, layer.padding,
                                    bias=layer.use_bias))
        elif layer.kind == "dense":
            layers.append(nn.Linear(source[-1], layer.units, bias=layer.use_bias))
        elif layer.kind == "maxpool":
            layers.append(nn.MaxPool2d(layer.pool_size, layer.stride, layer.padding))
        elif layer.kind in ("avgpool", "globalpool"):
            layers.append(nn.AvgPool2d(layer.pool_size, layer.stride, layer.padding))
        elif layer.kind == "bn":
            norm = nn.BatchNorm2d(source[-1]) if len(source) == 3 else nn.BatchNorm1d(source[-1])
            # PyTorch's eager mode has no fused batch norm + ReLU: the pair, as one step.
            layers.append(nn.Sequential(norm, nn.ReLU()) if layer.activation else norm)
        elif layer.kind == "dropout":
            layers.append(nn.Dropout(layer.rate))
        elif layer.kind in ("add", "concat"):
            layers.append(None)
        else:
            layers.append({"relu": nn.ReLU, "flatten": nn.Flatten}[layer.kind]())
    return layers


def torch_model(network: Network):
    """A torch.nn.Module that runs ``network``'s graph: each layer on the outputs of the layers it
    reads (the residual adds and the dense concatenations included)."""
    import torch

    class TorchGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.steps = torch.nn.ModuleList(module or torch.nn.Identity() for module in torch_layers(network))

        def forward(self, images):
            outputs: list = []
            for index, module in enumerate(self.steps):
                inputs = [images if s == network.INPUT else outputs[s] for s in network.inputs[index]]
                kind = network.layers[index].kind
                if kind == "add":
                    total = sum(inputs[1:], inputs[0])
                    outputs.append(torch.relu(total) if network.layers[index].activation else total)
                elif kind == "concat":
                    outputs.append(torch.cat(inputs, dim=1))
                else:
                    outputs.append(module(inputs[0]))
            return outputs[-1]

    return TorchGraph()


def torch_step(network: Network, batch: int, device: str, channels_last: bool, host_batch: bool = False):
    """A function that runs one PyTorch training step of ``network``'s translation; with
    ``host_batch``, from images in page-locked host memory."""
    import torch

    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True  # PyTorch at its best: cuDNN picks its fastest algorithms
    target = "cuda" if device == "gpu" else "cpu"
    model = torch_model(network).to(target)
    height, width, channels = network.input_shape
    images = torch.randn(batch, channels, height, width)
    if channels_last:
        model, images = model.to(memory_format=torch.channels_last), images.to(memory_format=torch.channels_last)
    if host_batch and target == "cuda":
        images = images.pin_memory()
    else:
        images = images.to(target)
    labels = torch.randint(0, network.num_classes, (batch,), device=target)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_function = torch.nn.CrossEntropyLoss()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_function(model(images.to(target, non_blocking=True)), labels).backward()
        optimizer.step()
        if target == "cuda":
            torch.cuda.synchronize()
    return step


def rate(flops_per_second: float) -> str:
    """A FLOP rate in TFLOP/s from 1 TFLOP/s up (GPUs), in GFLOP/s below (CPUs)."""
    if flops_per_second >= 1e12:
        return f"{flops_per_second / 1e12:.2f} TFLOP/s"
    return f"{flops_per_second / 1e9:.1f} GFLOP/s"


def main() -> None:
    parser = model_parser(__doc__)
    parser.set_defaults(batch_size=128)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--channels-last", action="store_true", help="PyTorch in NHWC memory layout")
    parser.add_argument("--host-batch", action="store_true",
                        help="PyTorch's step copies its images from page-locked host memory, as this framework's does")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("against_pytorch: PyTorch is not installed: pip install torch")
    set_blas_threads(args.threads)
    torch.set_num_threads(args.threads)
    trainer = make_trainer(args.model, args.dataset, args.batch_size, SerialCommunicator(), device=args.device)
    batch = trainer.load_step(0, 0)
    ours = lambda: trainer.train_step(batch)  # noqa: E731  (float(loss) waits for the GPU)
    network = trainer.network
    theirs = torch_step(network, args.batch_size, args.device, args.channels_last, args.host_batch)
    size = 8192 if args.device == "gpu" else 2048
    product = square_product(network.backend, size)
    samples = interleave([lambda: {"pydtnn_lite": timed(ours)}, lambda: {"pytorch": timed(theirs)},
                          lambda: {"product": timed(product)}], rounds=args.steps, warmup=2)
    ours_s, theirs_s = (float(np.median(samples[name])) for name in ("pydtnn_lite", "pytorch"))
    peak = 2.0 * size ** 3 / min(samples["product"])
    flops = args.batch_size * (network.flops_per_sample("FP") + network.flops_per_sample("BP"))
    layout = "NHWC" if args.channels_last else "NCHW"
    print(f"{args.model} on {args.dataset} {network.input_shape}, batch {args.batch_size}, {args.device}, "
          f"{args.threads} threads; PyTorch {torch.__version__} ({layout}"
          f"{', batch copied from host memory each step' if args.host_batch else ''})")
    print(f"step: pydtnn_lite {ours_s * 1e3:.1f} ms, PyTorch {theirs_s * 1e3:.1f} ms (medians of {args.steps})")
    print(f"throughput: pydtnn_lite {args.batch_size / ours_s:.1f} img/s, PyTorch {args.batch_size / theirs_s:.1f} "
          f"img/s: pydtnn_lite reaches {theirs_s / ours_s:.2f}x PyTorch's throughput")
    print(f"float32 GEMM peak {rate(peak)} (the fastest of {args.steps} products between the steps); "
          f"step {flops / 1e9:.1f} GFLOP: "
          f"pydtnn_lite {rate(flops / ours_s)} ({flops / ours_s / peak:.1%} of the peak), "
          f"PyTorch {rate(flops / theirs_s)} ({flops / theirs_s / peak:.1%})")
    if any(isinstance(layer, Conv2D) and layer.form(args.batch_size) == "winograd" for layer in network.layers):
        executed = sum(cost.flops for _, cost in network.costs(args.batch_size) if cost.stage in ("FP", "BP"))
        print(f"pydtnn_lite's kernels execute {executed / 1e9:.1f} of the {flops / 1e9:.1f} GFLOP "
              f"(Winograd convolutions): {rate(executed / ours_s)}, {executed / ours_s / peak:.1%} of the peak")


if __name__ == "__main__":
    main()
