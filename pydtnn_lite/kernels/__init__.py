"""Compute kernels: the unit that is timed, traced and modelled.

Layers call kernels only through this module's attributes (``kernels.gemm(...)``), never
by importing the functions directly. That single indirection is this module's hook
point: :func:`instrument` wraps every entry (the tracer times them) from outside the
layers, without a line of layer code knowing. With tracing off the entries are the plain
functions, so an untraced step pays nothing.

On the host, the memory-bound kernels (im2col, col2im, batch norm, ReLU, batch norm
fused with ReLU, the ReLU gradient of a sum of gradients, the residual add with the ReLU
after it fused in or not, the concatenation, pooling, the SGD and Adam updates, the sum of
micro-batch gradients, the gradient's norm and scaling) are the
Numba loops of :mod:`~pydtnn_lite.kernels.cpu` (the Winograd transforms: of
:mod:`~pydtnn_lite.kernels.winograd_cpu`), which use every thread of the process; the NumPy
versions they replace stay the reference. On a GPU, :mod:`~pydtnn_lite.kernels.gpu` runs
the window kernels (im2col, col2im and the pooling kernels) and the batch-norm kernels as
CUDA kernels, and the bias gradient through cuBLAS. An entry
picks its version by its first argument's array type, for the cost of one ``isinstance``
check.
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from pydtnn_lite.kernels import blas, cpu, elementwise, gpu, update, winograd, winograd_cpu
from pydtnn_lite.kernels.blas import bias_add, gemm
from pydtnn_lite.kernels.elementwise import dropout_apply, dropout_mask, split
from pydtnn_lite.kernels.loss import (
    softmax_cross_entropy,
    softmax_cross_entropy_grad,
    squared_error,
    squared_error_grad,
)
from pydtnn_lite.kernels.normalization import batchnorm_inference


def _by_array_type(host: Callable, device: Callable) -> Callable:
    """A kernel that runs ``host`` on a NumPy array and ``device`` on any other (a CuPy array),
    by its first argument; it bears ``host``'s name and docstring."""
    def kernel(array: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(array, np.ndarray):
            return host(array, *args, **kwargs)
        return device(array, *args, **kwargs)
    return functools.update_wrapper(kernel, host)


def _by_first_array_type(host: Callable, device: Callable) -> Callable:
    """:func:`_by_array_type` for kernels whose first argument is a sequence of arrays."""
    def kernel(arrays: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(arrays[0], np.ndarray):
            return host(arrays, *args, **kwargs)
        return device(arrays, *args, **kwargs)
    return functools.update_wrapper(kernel, host)


im2col = _by_array_type(cpu.im2col, gpu.im2col)
col2im = _by_array_type(cpu.col2im, gpu.col2im)
maxpool = _by_array_type(cpu.maxpool, gpu.maxpool)
maxpool_grad = _by_array_type(cpu.maxpool_grad, gpu.maxpool_grad)
avgpool = _by_array_type(cpu.avgpool, gpu.avgpool)
avgpool_grad = _by_array_type(cpu.avgpool_grad, gpu.avgpool_grad)
relu = _by_array_type(cpu.relu, elementwise.relu)
relu_grad = _by_array_type(cpu.relu_grad, elementwise.relu_grad)
relu_grad_sum = _by_first_array_type(cpu.relu_grad_sum, elementwise.relu_grad_sum)
add = _by_first_array_type(cpu.add, elementwise.add)
add_relu = _by_first_array_type(cpu.add_relu, elementwise.add_relu)
concat = _by_first_array_type(cpu.concat, elementwise.concat)
bias_grad = _by_array_type(blas.bias_grad, gpu.bias_grad)
batchnorm_sums = _by_array_type(cpu.batchnorm_sums, gpu.batchnorm_sums)
batchnorm_normalize = _by_array_type(cpu.batchnorm_normalize, gpu.batchnorm_normalize)
batchnorm_grad_sums = _by_array_type(cpu.batchnorm_grad_sums, gpu.batchnorm_grad_sums)
batchnorm_grad_input = _by_array_type(cpu.batchnorm_grad_input, gpu.batchnorm_grad_input)
batchnorm_relu_normalize = _by_array_type(cpu.batchnorm_relu_normalize, gpu.batchnorm_relu_normalize)
batchnorm_relu_grad_sums = _by_array_type(cpu.batchnorm_relu_grad_sums, gpu.batchnorm_relu_grad_sums)
batchnorm_relu_grad_input = _by_array_type(cpu.batchnorm_relu_grad_input, gpu.batchnorm_relu_grad_input)
winograd_filter = _by_array_type(winograd_cpu.filter_tiles, winograd.filter_tiles)
winograd_filter_grad = _by_array_type(winograd_cpu.filter_tiles_grad, winograd.filter_tiles_grad)
winograd_input = _by_array_type(winograd_cpu.input_tiles, winograd.input_tiles)
winograd_output = _by_array_type(winograd_cpu.output_tiles, winograd.output_tiles)
winograd_output_grad = _by_array_type(winograd_cpu.output_tiles_grad, winograd.output_tiles_grad)
winograd_input_grad = _by_array_type(winograd_cpu.input_tiles_grad, winograd.input_tiles_grad)
sgd_update = _by_array_type(cpu.sgd_update, update.sgd_update)
adam_update = _by_array_type(cpu.adam_update, update.adam_update)
start_gradient_sum = _by_array_type(cpu.start_gradient_sum, update.start_gradient_sum)
accumulate_gradients = _by_array_type(cpu.accumulate_gradients, update.accumulate_gradients)
gradient_norm = _by_array_type(cpu.gradient_norm, update.gradient_norm)
scale_gradient = _by_array_type(cpu.scale_gradient, update.scale_gradient)

__all__ = [
    "gemm", "bias_add", "bias_grad", "im2col", "col2im", "relu", "relu_grad", "relu_grad_sum",
    "dropout_mask", "dropout_apply", "add", "add_relu", "concat", "split", "softmax_cross_entropy",
    "softmax_cross_entropy_grad", "squared_error", "squared_error_grad", "batchnorm_sums",
    "batchnorm_normalize", "batchnorm_grad_sums",
    "batchnorm_grad_input", "batchnorm_relu_normalize", "batchnorm_relu_grad_sums", "batchnorm_relu_grad_input",
    "batchnorm_inference", "maxpool", "maxpool_grad", "avgpool", "avgpool_grad",
    "winograd_filter", "winograd_filter_grad", "winograd_input", "winograd_output", "winograd_output_grad",
    "winograd_input_grad", "sgd_update", "adam_update", "start_gradient_sum", "accumulate_gradients",
    "gradient_norm", "scale_gradient",
]


def instrument(wrap: Callable[[str, Callable], Callable]) -> Callable[[], None]:
    """Replace every kernel entry ``name`` with ``wrap(name, kernel)``; return the function
    that puts the plain kernels back."""
    module = sys.modules[__name__]
    plain = {name: getattr(module, name) for name in __all__}
    for name, kernel in plain.items():
        setattr(module, name, wrap(name, kernel))

    def restore() -> None:
        for name, kernel in plain.items():
            setattr(module, name, kernel)
    return restore
