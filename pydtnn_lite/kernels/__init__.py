"""Compute kernels: the unit that is timed, traced and modelled.

Layers call kernels only through this module's attributes (``kernels.gemm(...)``), never
by importing the functions directly. That single indirection lets the tracer replace an
entry with a timed wrapper from outside the layers, and lets a backend swap in a faster
implementation, without a line of layer code knowing. With tracing off the entries are
the plain functions, so an untraced step pays nothing.
"""
from pydtnn_lite.kernels.blas import bias_add, bias_grad, gemm
from pydtnn_lite.kernels.conv import col2im, im2col
from pydtnn_lite.kernels.elementwise import (add, concat, dropout_mask, dropout_apply, relu,
                                             relu_grad, split)
from pydtnn_lite.kernels.loss import (softmax_cross_entropy, softmax_cross_entropy_grad, squared_error,
                                      squared_error_grad)
from pydtnn_lite.kernels.normalization import (batchnorm_grad_input, batchnorm_grad_sums,
                                               batchnorm_inference, batchnorm_normalize,
                                               batchnorm_sums)
from pydtnn_lite.kernels.pooling import avgpool, avgpool_grad, maxpool, maxpool_grad
from pydtnn_lite.kernels.update import adam_update, sgd_update

__all__ = [
    "gemm", "bias_add", "bias_grad", "im2col", "col2im", "relu", "relu_grad",
    "dropout_mask", "dropout_apply", "add", "concat", "split", "softmax_cross_entropy",
    "softmax_cross_entropy_grad", "squared_error", "squared_error_grad", "batchnorm_sums",
    "batchnorm_normalize", "batchnorm_grad_sums",
    "batchnorm_grad_input",
    "batchnorm_inference", "maxpool", "maxpool_grad", "avgpool", "avgpool_grad",
    "sgd_update", "adam_update",
]
