"""The CUDA window kernels (kernels/gpu_kernels.cu, launched by kernels/gpu.py) against the NumPy ones.

Without a GPU the CUDA source is checked two ways: nvcc compiles it to PTX, and g++
compiles the very same file for the host behind a prelude that stands in for CUDA's
built-ins. gpu.py then runs unchanged on NumPy arrays, with a stand-in for CuPy whose
launches call the host build once per thread of a small emulated grid. With a GPU the same
comparisons run through CuPy, and whole networks run forward and backward on both devices.
"""
from __future__ import annotations

import ctypes
import functools
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pydtnn_lite import kernels
from pydtnn_lite.backend import Backend, gpu_available, make_backend
from pydtnn_lite.kernels import blas, conv, cpu, gpu, normalization, pooling
from pydtnn_lite.layers import StepContext
from pydtnn_lite.models import create_model

from helpers import every_layer_network

KERNEL_SOURCE = Path(gpu.__file__).with_name("gpu_kernels.cu")
WINDOW_KERNELS = ("im2col", "col2im", "maxpool", "maxpool_grad", "avgpool", "avgpool_grad")
BATCHNORM_KERNELS = ("batchnorm_normalize", "batchnorm_sums", "batchnorm_grad_sums", "batchnorm_grad_input")

# What CUDA provides and the kernels use, for g++: the qualifiers compile away, the thread
# coordinates are globals that the emulated launch sets, and the intrinsics are plain C++
# (built with -ffp-contract=off, a product rounds on its own as __fmul_rn's does).
HOST_PRELUDE = r"""
#include <cstring>
#define __global__
#define __device__
#define __forceinline__ inline
struct dim3 { unsigned int x, y, z; };
extern "C" { dim3 threadIdx, blockIdx, blockDim, gridDim; }
static inline float __int_as_float(int bits) { float f; std::memcpy(&f, &bits, sizeof f); return f; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
"""
# Each launch runs as 2 blocks of 3 threads, one after another: the kernels share nothing
# between threads, so any order is valid, and the grid-stride loops still split the work.
EMULATED_BLOCKS, EMULATED_THREADS = 2, 3

# (NHWC input shape, window height, window width, stride, padding)
CONV_CASES = [
    ((2, 7, 6, 3), 3, 3, 1, 1),
    ((2, 9, 8, 3), 5, 5, 2, 2),
    ((2, 31, 27, 3), 11, 11, 4, 2),  # AlexNet's first layer, on an odd, non-square map
    ((1, 8, 8, 2), 3, 3, 2, 0),  # the last row and column are in no window
    ((2, 6, 6, 2), 2, 2, 3, 1),  # stride > kernel: gaps between the windows
    ((2, 7, 7, 4), 1, 1, 2, 0),  # gpu.im2col takes the NumPy version (a strided copy)
    ((2, 5, 6, 3), 1, 1, 2, 1),
    ((2, 5, 5, 3), 1, 1, 1, 0),  # both take the NumPy versions (reshapes)
    ((2, 8, 9, 3), 3, 5, 2, 1),  # the layers' windows are square, the kernels' need not be
]
POOL_CASES = [
    ((2, 13, 13, 3), 3, 3, 2, 0),  # AlexNet's overlapping pooling
    ((2, 8, 6, 3), 2, 2, 2, 0),  # the windows tile the map
    ((2, 7, 9, 2), 2, 2, 2, 0),  # odd sizes: the last row and column are in no window
    ((2, 9, 8, 2), 3, 3, 2, 1),  # ResNet's stem pooling
    ((1, 5, 5, 2), 3, 3, 1, 1),
    ((2, 5, 5, 3), 2, 2, 1, 0),
    ((2, 4, 4, 3), 4, 4, 4, 0),  # global: average pooling takes the NumPy versions
    ((2, 7, 8, 2), 2, 3, 2, 1),
]
DTYPES = [np.float32, np.float64]


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


@pytest.fixture(scope="module")
def host_library(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """gpu_kernels.cu, unchanged, built for the host behind HOST_PRELUDE."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ is not installed")
    folder = tmp_path_factory.mktemp("host_kernels")
    source, library = folder / "gpu_kernels.cpp", folder / "gpu_kernels.so"
    source.write_text(HOST_PRELUDE + KERNEL_SOURCE.read_text())
    result = subprocess.run([compiler, "-O1", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", "-shared",
                             "-fPIC", "-o", str(library), str(source)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return ctypes.CDLL(str(library))


def emulate_launch(library: ctypes.CDLL, name: str, grid: tuple, block: tuple, args: tuple) -> None:
    """Run kernel ``name`` of the host build as a launch of the emulated grid would, checking
    what gpu.py passes as CuPy would need it."""
    assert len(grid) == len(block) == 1 and 1 <= grid[0] < 2 ** 31 and 1 <= block[0] <= 1024
    c_args = []
    for arg in args:
        if isinstance(arg, np.ndarray):
            # Contiguous, or a matrix of contiguous rows, which the batch-norm kernels read with a row stride.
            assert arg.flags.c_contiguous or (arg.ndim == 2 and arg.strides[1] == arg.itemsize)
            c_args.append(ctypes.c_void_p(arg.ctypes.data))
        else:
            # CuPy passes a NumPy scalar in its own width: int or long long, as the kernel's index type.
            assert type(arg) in (np.int32, np.int64) and name.endswith("_i32" if type(arg) is np.int32 else "_i64")
            c_args.append(ctypes.c_int(arg) if type(arg) is np.int32 else ctypes.c_longlong(arg))
    coordinates = {c: Dim3.in_dll(library, c) for c in ("threadIdx", "blockIdx", "blockDim", "gridDim")}
    coordinates["gridDim"].x, coordinates["blockDim"].x = EMULATED_BLOCKS, EMULATED_THREADS
    for block_index in range(EMULATED_BLOCKS):
        for thread_index in range(EMULATED_THREADS):
            coordinates["blockIdx"].x, coordinates["threadIdx"].x = block_index, thread_index
            getattr(library, name)(*c_args)


def host_cupy(library: ctypes.CDLL) -> SimpleNamespace:
    """The part of CuPy that gpu.py uses, on NumPy arrays and the host build of the kernels."""
    def raw_module(code: str) -> SimpleNamespace:
        assert code == KERNEL_SOURCE.read_text()
        return SimpleNamespace(get_function=lambda name: functools.partial(emulate_launch, library, name))

    def empty(shape: tuple, dtype: Any) -> np.ndarray:
        array = np.empty(shape, dtype)
        array.view(np.uint8).fill(0xFF)  # NaN in a float, 255 in an argmax: an element left unwritten shows
        return array

    return SimpleNamespace(RawModule=raw_module, empty=empty, ascontiguousarray=np.ascontiguousarray, uint8=np.uint8,
                           ones=np.ones, zeros=np.zeros, matmul=np.matmul, stack=np.stack, float64=np.float64)


class HostArray:
    """An array that is not a NumPy array, as a CuPy array is not, for the dispatch test on the host."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.array


@dataclass
class Device:
    """Where gpu.py's kernels run: ``asarray`` makes their arguments from NumPy arrays and
    ``to_host`` reads their results; ``foreign`` makes an array that is not NumPy's."""

    asarray: Callable[[np.ndarray], Any]
    to_host: Callable[[Any], np.ndarray]
    foreign: Callable[[np.ndarray], Any]
    backend: Backend  # float64, for whole networks

    def run(self, name: str, *args: Any) -> Any:
        """``gpu.<name>(*args)``, with NumPy arguments moved to the device and the results back."""
        result = getattr(gpu, name)(*(self.asarray(a) if isinstance(a, np.ndarray) else a for a in args))
        return tuple(map(self.to_host, result)) if isinstance(result, tuple) else self.to_host(result)


@pytest.fixture(params=["host", "cuda"])
def device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Device]:
    """gpu.py on the host build of the kernels, and on a GPU when there is one."""
    if request.param == "host":
        monkeypatch.setitem(sys.modules, "cupy", host_cupy(request.getfixturevalue("host_library")))
        chosen = Device(np.asarray, np.asarray, HostArray, make_backend("cpu", "float64"))
    else:
        if not gpu_available():
            pytest.skip("no CUDA GPU")
        import cupy
        chosen = Device(cupy.asarray, cupy.asnumpy, cupy.asarray, make_backend("gpu", "float64"))
    # gpu.py caches the compiled module; each device compiles its own.
    gpu._module.cache_clear()
    gpu._function.cache_clear()
    yield chosen
    gpu._module.cache_clear()
    gpu._function.cache_clear()


def assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal shape, dtype and values (NaN equal to NaN)."""
    np.testing.assert_array_equal(actual, expected, strict=True)


def test_the_kernels_compile_to_ptx(tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    ptx = tmp_path / "gpu_kernels.ptx"
    result = subprocess.run([nvcc, "-ptx", "-arch=compute_75", "-Werror", "all-warnings", "-o", str(ptx),
                             str(KERNEL_SOURCE)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    entries = set(re.findall(r"\.entry (\w+)\(", ptx.read_text()))
    assert entries == {f"{name}_{dtype}_{index}" for name in WINDOW_KERNELS + BATCHNORM_KERNELS
                       for dtype in ("f32", "f64") for index in ("i32", "i64")}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,kh,kw,stride,padding", CONV_CASES)
def test_im2col_and_col2im(device: Device, shape: tuple, kh: int, kw: int, stride: int, padding: int,
                           dtype: type) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype(dtype)
    expected = conv.im2col(x, kh, kw, stride, padding)
    assert_same(device.run("im2col", x, kh, kw, stride, padding), expected)
    grad_cols = rng.normal(size=expected.shape).astype(dtype)
    assert_same(device.run("col2im", grad_cols, shape, kh, kw, stride, padding),
                conv.col2im(grad_cols, shape, kh, kw, stride, padding))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,kh,kw,stride,padding", POOL_CASES)
def test_maxpool_and_its_gradient(device: Device, shape: tuple, kh: int, kw: int, stride: int, padding: int,
                                  dtype: type) -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(-3, 4, size=shape).astype(dtype)  # few values: most windows hold ties
    out, argmax = pooling.maxpool(x, kh, kw, stride, padding)
    actual_out, actual_argmax = device.run("maxpool", x, kh, kw, stride, padding)
    assert_same(actual_out, out)
    assert_same(actual_argmax, argmax)
    grad_out = rng.normal(size=out.shape).astype(dtype)
    assert_same(device.run("maxpool_grad", grad_out, argmax, shape, kh, kw, stride, padding),
                pooling.maxpool_grad(grad_out, argmax, shape, kh, kw, stride, padding))


@pytest.mark.parametrize("dtype", DTYPES)
def test_maxpool_propagates_nan_and_infinities(device: Device, dtype: type) -> None:
    rng = np.random.default_rng(2)
    x = rng.integers(-3, 4, size=(2, 9, 9, 3)).astype(dtype)
    x.flat[rng.choice(x.size, 30, replace=False)] = -np.inf
    x.flat[rng.choice(x.size, 10, replace=False)] = np.nan
    x[0, :4, :4, 0] = -np.inf  # a window, and its padding, of -inf only
    out, argmax = pooling.maxpool(x, 3, 3, 2, 1)
    actual_out, actual_argmax = device.run("maxpool", x, 3, 3, 2, 1)
    assert np.isnan(out).any() and np.isneginf(out).any()
    assert_same(actual_out, out)
    assert_same(actual_argmax, argmax)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,kh,kw,stride,padding", POOL_CASES)
def test_avgpool_and_its_gradient(device: Device, shape: tuple, kh: int, kw: int, stride: int, padding: int,
                                  dtype: type) -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=shape).astype(dtype)  # sums that round: the order of the additions shows
    out = pooling.avgpool(x, kh, kw, stride, padding)
    actual = device.run("avgpool", x, kh, kw, stride, padding)
    if (kh, kw, padding) == shape[1:3] + (0,):  # a global mean: CuPy's adds in another order than NumPy's
        np.testing.assert_allclose(actual, out, rtol=1e-6 if dtype == np.float32 else 1e-14)
    else:
        assert_same(actual, out)
    grad_out = rng.normal(size=out.shape).astype(dtype)
    assert_same(device.run("avgpool_grad", grad_out, shape, kh, kw, stride, padding),
                pooling.avgpool_grad(grad_out, shape, kh, kw, stride, padding))


@pytest.mark.parametrize("dtype", DTYPES)
def test_channel_sums_give_the_numpy_sums(device: Device, dtype: type) -> None:
    """The bias gradient and the batch-norm sums as products with a vector of ones: the references'
    sums to rounding (they add in another order)."""
    rng = np.random.default_rng(7)
    x = (rng.normal(size=(3, 5, 4, 6)) * 2 + 1e3).astype(dtype)  # far from 0: deviations must not cancel
    grad = rng.normal(size=x.shape).astype(dtype)
    mean, inv_std = x.mean(axis=(0, 1, 2)).astype(dtype), (1 / x.std(axis=(0, 1, 2))).astype(dtype)
    gamma, beta = (rng.normal(size=6).astype(dtype) for _ in range(2))
    rtol = 1e-5 if dtype == np.float32 else 1e-12

    def assert_near(actual: np.ndarray, expected: np.ndarray) -> None:
        assert actual.shape == expected.shape
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * np.abs(expected).max())

    rows = grad.reshape(-1, 6)
    assert_near(device.run("bias_grad", rows, np.empty(6, dtype)), blas.bias_grad(rows, np.empty(6, dtype)))
    assert_near(device.run("batchnorm_sums", x), normalization.batchnorm_sums(x))
    assert_near(device.run("batchnorm_grad_sums", grad, x, mean, inv_std),
                normalization.batchnorm_grad_sums(grad, x, mean, inv_std))
    assert_near(device.run("batchnorm_relu_grad_sums", grad, x, mean, inv_std, gamma, beta),
                normalization.batchnorm_relu_grad_sums(grad, x, mean, inv_std, gamma, beta))
    assert_same(device.run("batchnorm_sums", np.zeros((0, 6), dtype)), np.zeros((2, 6)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("shape,sliced", [((3, 5, 4, 6), False), ((3, 5, 4, 6), True), ((1, 1, 1, 6), True)])
def test_batchnorm_kernels_compute_what_the_references_compute(device: Device, dtype: type, relu: bool,
                                                               shape: tuple, sliced: bool) -> None:
    """The one-pass batch-norm kernels against kernels/normalization.py: the element-wise ones
    bit for bit (each operation rounded as NumPy rounds it, in its order), the sums to
    rounding (float64 partial sums per slot of rows, which NumPy adds in another order).
    ``sliced``: the input, the upstream gradient and the addend are channel slices of wider
    maps made on the device (a dense block's parts), which the kernels read in place."""
    rng = np.random.default_rng(8)
    channels = shape[-1]

    def tensor(offset: float) -> Any:
        wide = rng.normal(size=shape[:-1] + (channels + 3 * sliced,)) * 2 + offset
        return device.asarray(wide.astype(dtype))[..., 3 * sliced:]

    x, grad, addend = tensor(1e3), tensor(0.0), tensor(0.0)
    host_x, host_grad, host_addend = (device.to_host(a) for a in (x, grad, addend))
    mean = host_x.mean(axis=(0, 1, 2)).astype(dtype)
    inv_std = (1 / (host_x.std(axis=(0, 1, 2)) + 1)).astype(dtype)
    gamma, beta = rng.normal(size=channels).astype(dtype), rng.normal(size=channels).astype(dtype)
    rows = int(np.prod(shape[:-1]))
    fused = "_relu" if relu else ""
    per_channel = (mean, inv_std, gamma, beta) if relu else (mean, inv_std)
    reference = {name: getattr(normalization, f"batchnorm{fused}_{name}")
                 for name in ("normalize", "grad_sums", "grad_input")}
    rtol = 1e-5 if dtype == np.float32 else 1e-12

    def assert_near(actual: np.ndarray, expected: np.ndarray, tolerance: float) -> None:
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance * np.abs(expected).max())

    assert_same(device.run(f"batchnorm{fused}_normalize", x, mean, inv_std, gamma, beta),
                reference["normalize"](host_x, mean, inv_std, gamma, beta))
    assert_near(device.run("batchnorm_sums", x), normalization.batchnorm_sums(host_x), 1e-10)
    sums = reference["grad_sums"](host_grad, host_x, *per_channel)
    assert_near(device.run(f"batchnorm{fused}_grad_sums", grad, x, *per_channel), sums, rtol)
    with_gamma = (mean, inv_std, gamma, beta) if relu else (mean, inv_std, gamma)
    for added, host_added in ((None, None), (addend, host_addend)):
        assert_same(device.run(f"batchnorm{fused}_grad_input", grad, x, *with_gamma, sums, rows, added),
                    reference["grad_input"](host_grad, host_x, *with_gamma, sums, rows, host_added))


def test_the_64_bit_index_kernels_compute_what_the_32_bit_ones_compute(device: Device,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrays of 2**30 elements or more are indexed in 64 bits: the same kernels, forced to that
    width on small arrays, give the 32-bit kernels' results."""
    rng = np.random.default_rng(9)
    x = rng.normal(size=(2, 9, 8, 3))
    cols = rng.normal(size=(2 * 5 * 4, 27))
    grad = rng.normal(size=x.shape)
    per_channel = tuple(rng.uniform(0.5, 1.5, size=3) for _ in range(4))
    sums = normalization.batchnorm_relu_grad_sums(grad, x, *per_channel)
    cases = [("im2col", x, 3, 3, 2, 1), ("col2im", cols, x.shape, 3, 3, 2, 1), ("maxpool", x, 3, 3, 2, 1),
             ("avgpool", x, 3, 3, 2, 1), ("batchnorm_relu_normalize", x, *per_channel), ("batchnorm_sums", x),
             ("batchnorm_relu_grad_sums", grad, x, *per_channel),
             ("batchnorm_relu_grad_input", grad, x, *per_channel, sums, 144, grad)]
    narrow = [device.run(*case) for case in cases]
    launched: list[str] = []
    function = gpu._function
    with monkeypatch.context() as wide:  # undone before the device fixture clears gpu._function's cache
        wide.setattr(gpu, "_function", lambda name: launched.append(name) or function(name))
        wide.setattr(gpu, "INDEX_LIMIT", 0)
        for case, expected in zip(cases, narrow, strict=True):
            actual = device.run(*case)
            for a, b in zip(actual if isinstance(actual, tuple) else (actual,),
                            expected if isinstance(expected, tuple) else (expected,), strict=True):
                assert_same(a, b)
    assert len(launched) == len(cases) and all(name.endswith("_f64_i64") for name in launched)


def test_entries_run_numpy_arrays_on_numpy_and_others_on_cuda(device: Device,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    launched = []

    def recording_launch(kernel: str, *args: Any) -> None:
        launched.append(kernel)
        launch(kernel, *args)

    launch = gpu._launch
    monkeypatch.setattr(gpu, "_launch", recording_launch)
    x = np.random.default_rng(4).normal(size=(2, 6, 6, 3))
    expected = kernels.maxpool(x, 3, 3, 2, 0)
    assert launched == []
    actual = kernels.maxpool(device.foreign(x), 3, 3, 2, 0)
    assert launched == ["maxpool"]
    for a, b in zip(actual, expected, strict=True):
        assert_same(device.to_host(a), b)
    host = {**vars(pooling), **vars(cpu)}  # the host versions: Numba's where there is one
    for name in WINDOW_KERNELS:
        entry = getattr(kernels, name)
        assert (entry.__name__, entry.__doc__) == (name, host[name].__doc__)


def test_the_kernels_reject_other_dtypes(device: Device) -> None:
    with pytest.raises(TypeError, match="float32 or float64"):
        gpu.maxpool(device.asarray(np.zeros((1, 4, 4, 1), dtype=np.float16)), 2, 2, 2, 0)


def forward_backward(model: str, shape: tuple, backend: Backend) -> tuple[np.ndarray, np.ndarray]:
    """Logits and flat parameter gradient of one forward and backward pass of ``model`` on ``backend``."""
    rng = np.random.default_rng(5)
    images, grad_logits = rng.normal(size=(2,) + shape), rng.normal(size=(2, 10))
    network = every_layer_network(shape, 10) if model == "every" else create_model(model, shape, 10)
    network.build(backend, seed=6)
    logits = network.forward(backend.asarray(images), StepContext(training=True, global_batch=2, step=1))
    network.backward(backend.asarray(grad_logits))
    return backend.to_host(logits), backend.to_host(network.flat_grads)


@pytest.mark.parametrize("model,shape", [("every", (9, 9, 3)), ("alexnet", (67, 67, 3)), ("resnet18", (64, 64, 3))])
def test_networks_on_the_cuda_kernels_compute_what_they_compute_on_numpy(
        device: Device, model: str, shape: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """Logits and parameter gradients: exactly NumPy's on the host build, where nothing else
    differs; within rounding on a GPU, where cuBLAS and CuPy's reductions do."""
    with monkeypatch.context() as reference:  # the NumPy window kernels, not the host's Numba ones
        numpy_versions = {**vars(conv), **vars(pooling)}
        for name in WINDOW_KERNELS:
            reference.setattr(kernels, name, numpy_versions[name])
        expected = forward_backward(model, shape, make_backend("cpu", "float64"))
    on_host = device.backend.xp is np
    if on_host:  # the entries would run NumPy arrays on the NumPy versions
        for name in WINDOW_KERNELS:
            monkeypatch.setattr(kernels, name, getattr(gpu, name))
    tolerance = 0.0 if on_host else 1e-9
    for actual, wanted in zip(forward_backward(model, shape, device.backend), expected, strict=True):
        np.testing.assert_allclose(actual, wanted, rtol=tolerance, atol=tolerance * np.abs(wanted).max())
