"""Batch normalisation over the channel axis of NHWC tensors (statistics over N, H, W).

The statistics are split into local sums and a normalisation step so that a
distributed job can add the sums of all ranks in between: every rank then normalises
with the statistics of the whole global batch, and P ranks compute exactly what one
rank would with the same batch.

The sums are taken about a per-channel ``shift`` that every rank shares, in float64, and
each rank's sum of squares comes from its own two-pass (mean, then squared deviations):
``E[x^2] - E[x]^2`` in the input's precision cancels to nothing once the mean is large
next to the spread (float32 inputs near 1e3), which these sums never do.
"""
from __future__ import annotations

from typing import Any

from pydtnn_lite.backend import array_module
from pydtnn_lite.kernels.elementwise import relu_grad


def batchnorm_sums(x: Any) -> Any:
    """Per-channel sum of ``x`` and sum of squared deviations from its own mean, over all
    rows of ``x`` (..., C), stacked as (2, C) in float64."""
    xp = array_module(x)
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[0] == 0:
        return xp.zeros((2, flat.shape[1]), dtype=xp.float64)
    mean = flat.mean(axis=0, dtype=xp.float64)
    centred = flat - mean
    return xp.stack([flat.shape[0] * mean, xp.einsum("ij,ij->j", centred, centred)])


def shifted_sums(sums: Any, rows: int, shift: Any) -> Any:
    """From :func:`batchnorm_sums` of ``rows`` rows, the per-channel sums of ``x - shift`` and
    of its square: what every rank adds, about a ``shift`` (float64, (C,)) they share."""
    offset = sums[0] / rows - shift if rows else 0.0 * shift
    return array_module(sums).stack([rows * offset, sums[1] + rows * offset * offset])


def batchnorm_normalize(x: Any, mean: Any, inv_std: Any, gamma: Any, beta: Any) -> Any:
    """Return gamma * x_hat + beta with x_hat = (x - mean) * inv_std.

    x_hat is not kept: the backward kernels take x, mean and inv_std and compute it again
    as they read x, one array written less per forward call (PyTorch keeps the same)."""
    return normalized(x, mean, inv_std) * gamma + beta


def normalized(x: Any, mean: Any, inv_std: Any) -> Any:
    """x_hat = (x - mean) * inv_std, as the forward computed it."""
    return (x - mean) * inv_std


def batchnorm_inference(x: Any, gamma: Any, beta: Any, mean: Any, var: Any, eps: float) -> Any:
    """Normalise with stored running statistics (evaluation mode)."""
    xp = array_module(x)
    scale = gamma / xp.sqrt(var + eps)
    return x * scale + (beta - mean * scale)


def batchnorm_grad_sums(grad_out: Any, x: Any, mean: Any, inv_std: Any) -> Any:
    """Per-channel (sum of grad, sum of grad * x_hat), stacked as (2, C): beta's and gamma's gradients."""
    xp = array_module(grad_out)
    flat_grad = grad_out.reshape(-1, grad_out.shape[-1])
    flat_hat = normalized(x, mean, inv_std).reshape(-1, x.shape[-1])
    return xp.stack([flat_grad.sum(axis=0), xp.einsum("ij,ij->j", flat_grad, flat_hat)])


def batchnorm_grad_input(grad_out: Any, x: Any, mean: Any, inv_std: Any, gamma: Any, grad_sums: Any,
                         rows: int, addend: Any = None) -> Any:
    """Input gradient, given the (all-rank) ``grad_sums`` and the (all-rank) row count; plus
    ``addend`` where given (the gradient the input has from its other consumers)."""
    mean_grad = grad_sums[0] / rows
    mean_grad_hat = grad_sums[1] / rows
    grad_in = (gamma * inv_std) * (grad_out - mean_grad - normalized(x, mean, inv_std) * mean_grad_hat)
    return grad_in if addend is None else grad_in + addend


# The fused batch norm + ReLU kernels. These references define the results through the
# unfused kernels; the host versions (kernels.cpu) make one pass each, never writing the
# ReLU output or the masked gradient to a separate array. The backward kernels take the
# layer's input and parameters, not its output: the output's sign, which masks the
# upstream gradient, is computed again as the forward computed it.
def batchnorm_relu_normalize(x: Any, mean: Any, inv_std: Any, gamma: Any, beta: Any) -> Any:
    """Return max(gamma * x_hat + beta, 0) with x_hat = (x - mean) * inv_std."""
    out = batchnorm_normalize(x, mean, inv_std, gamma, beta)
    return array_module(x).maximum(out, 0, out=out)


def relu_masked(grad_out: Any, x: Any, mean: Any, inv_std: Any, gamma: Any, beta: Any) -> Any:
    """``grad_out`` where the fused layer's output gamma * x_hat + beta is positive, 0 elsewhere."""
    return relu_grad(grad_out, batchnorm_normalize(x, mean, inv_std, gamma, beta))


def batchnorm_relu_grad_sums(grad_out: Any, x: Any, mean: Any, inv_std: Any, gamma: Any, beta: Any) -> Any:
    """:func:`batchnorm_grad_sums` of the upstream gradient masked by the fused layer's output
    being positive (:func:`relu_masked`)."""
    return batchnorm_grad_sums(relu_masked(grad_out, x, mean, inv_std, gamma, beta), x, mean, inv_std)


def batchnorm_relu_grad_input(grad_out: Any, x: Any, mean: Any, inv_std: Any, gamma: Any, beta: Any,
                              grad_sums: Any, rows: int, addend: Any = None) -> Any:
    """:func:`batchnorm_grad_input` of the upstream gradient masked as in
    :func:`batchnorm_relu_grad_sums`, given the (all-rank) sums of that kernel."""
    return batchnorm_grad_input(relu_masked(grad_out, x, mean, inv_std, gamma, beta), x, mean, inv_std, gamma,
                                grad_sums, rows, addend)
