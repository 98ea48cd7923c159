"""Per-kernel regression models: the run time of one kernel call from its operand sizes.

A sample is one measured call: the ``dims`` of its :class:`~pydtnn_lite.layers.KernelCost`,
its analytic FLOPs and bytes, and the median seconds it took. Three models learn
``seconds`` from them:

- :class:`MLPRegressor`, the model of Barrachina et al. (2021): log-scaled, standardised
  operand sizes in, log(seconds) out, five Dense+ReLU layers of 50 units and one output,
  trained with this framework's own layers, mean squared error and Adam, with early
  stopping on a held-out fifth of its training samples; :class:`MLPEnsemble` averages
  five of them, trained with different seeds;
- two closed-form fallbacks for kernels sampled too few times to train an MLP:
  :class:`RateModel` (``overhead + flops / flop_rate + bytes / byte_rate``) and
  :class:`LogLinearModel` (a power law of the sizes).

:func:`fit_kernel_model` fits the candidates, compares them on held-out samples and keeps
the best; :func:`fit_kernel_models` does so for many kernels, training the MLPs in
parallel. Every model has ``predict(dims, flops, bytes) -> seconds`` and round-trips
through ``to_dict`` / :func:`model_from_dict` (plain JSON values).
"""
from __future__ import annotations

import base64
import itertools
import math
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from pydtnn_lite.backend import make_backend
from pydtnn_lite.kernels.cpu import in_place
from pydtnn_lite.layers import Dense, MeanSquaredError, ReLU, StepContext
from pydtnn_lite.network import Network
from pydtnn_lite.optim import Adam

MIN_SECONDS = 1e-9  # a timer reading of 0 would have no logarithm; no prediction is shorter either
HELD_OUT = 0.2  # the paper's split: 80 % to train, 20 % to test (and, inside training, to validate)
STORED_WEIGHTS = np.dtype("<f2")  # little-endian float16: how a calibration file keeps MLP weights
MLP_MIN_SAMPLES = 30  # below this an MLP's 20 % validation set is too small to stop it in time
ENSEMBLE_MEMBERS = 5


@dataclass(frozen=True, slots=True)
class KernelSample:
    """One measured kernel call: its cost's ``dims``, FLOPs and bytes, and the median seconds."""

    dims: tuple
    flops: float
    bytes: float
    seconds: float


def sample_columns(samples: list[KernelSample]) -> dict:
    """Samples as four parallel lists: a third of the size of one list per sample."""
    return {"dims": [list(s.dims) for s in samples], "flops": [s.flops for s in samples],
            "bytes": [s.bytes for s in samples], "seconds": [s.seconds for s in samples]}


def samples_from_columns(columns: dict) -> list[KernelSample]:
    """The samples of :func:`sample_columns`' lists."""
    return [KernelSample(tuple(map(int, dims)), float(flops), float(nbytes), float(seconds))
            for dims, flops, nbytes, seconds in zip(columns["dims"], columns["flops"], columns["bytes"],
                                                    columns["seconds"], strict=True)]


def features(dims: Sequence[float], flops: float, nbytes: float) -> np.ndarray:
    """The regression inputs of a call: log(1 + x) of each dim, of the FLOPs and of the bytes.

    Sizes span many orders of magnitude and run time grows as a power of them, so their
    logarithms are what a model can fit; the 1 keeps zeros (no padding, no FLOPs) finite.
    """
    return np.log1p(np.array([*dims, flops, nbytes], dtype=np.float64))


def _matrix(samples: Sequence[KernelSample]) -> tuple[np.ndarray, np.ndarray]:
    """Features (one row per sample) and seconds of ``samples``; every dims must have one length."""
    arity = {len(s.dims) for s in samples}
    if len(arity) != 1:
        raise ValueError(f"samples of one kernel must have dims of one length, got lengths {sorted(arity)}")
    x = np.stack([features(s.dims, s.flops, s.bytes) for s in samples])
    return x, np.maximum(np.array([s.seconds for s in samples]), MIN_SECONDS)


_Model = TypeVar("_Model", bound="KernelModel")


class KernelModel:
    """A fitted model of one kernel's run time.

    ``samples`` is the number of samples it was fitted on. ``held_out_error`` is its median
    relative error on samples it was not fitted on, and ``held_out_time_error`` the total
    absolute error over the total time of those samples, which weighs each call by its
    time as a training step does (both NaN when there were too few to hold any out).
    """

    kind = ""

    def __init__(self) -> None:
        self.held_out_error = self.held_out_time_error = math.nan
        self.samples = 0

    @classmethod
    def fit(cls: type[_Model], samples: Sequence[KernelSample]) -> _Model:
        """A model of this kind fitted to ``samples``."""
        raise NotImplementedError

    def predict(self, dims: Sequence[int], flops: float, nbytes: float) -> float:
        """Seconds of one call with these operand sizes, FLOPs and bytes."""
        return float(self.predict_features(features(dims, flops, nbytes)[None, :])[0])

    def predict_features(self, x: np.ndarray) -> np.ndarray:
        """Seconds for each row of a :func:`features` matrix."""
        raise NotImplementedError

    def to_dict(self) -> dict:
        """Plain JSON values (an error that could not be measured is None, not NaN)."""
        errors = {"held_out_error": self.held_out_error, "held_out_time_error": self.held_out_time_error}
        return {"kind": self.kind, "samples": self.samples,
                **{name: None if math.isnan(value) else value for name, value in errors.items()},
                **self._parameters()}

    def _parameters(self) -> dict:
        raise NotImplementedError

    def _restore_fit_figures(self: _Model, data: dict) -> _Model:
        self.samples = int(data["samples"])
        self.held_out_error, self.held_out_time_error = (
            math.nan if data[name] is None else float(data[name]) for name in ("held_out_error", "held_out_time_error"))
        return self


class RateModel(KernelModel):
    """``seconds = overhead + flops / flop_rate + bytes / byte_rate``, each term non-negative.

    On a CPU a small kernel call costs a fixed few microseconds (Python and NumPy
    dispatch) and a large one grows linearly with the work it does, so its run time bends
    from flat to linear as sizes grow; a sum of a constant and two rates bends the same
    way, and its coefficients are the kernel's call overhead and achieved rates. Where
    FLOPs and bytes grow together, as they do for most kernels, the roofline's max of a
    compute and a memory time has the same shape as their sum; the sum is linear in its
    three coefficients, so its fit is exact and cheap, where the max needs a non-linear one.

    Fitted to minimise the squared *relative* error (each row divided by its measured
    time), so small calls weigh as much as large ones; the non-negativity of the three
    coefficients is enforced by trying every subset of the terms.
    """

    kind = "rate"

    def __init__(self, overhead: float, seconds_per_flop: float, seconds_per_byte: float) -> None:
        super().__init__()
        self.coefficients = np.array([overhead, seconds_per_flop, seconds_per_byte], dtype=np.float64)

    @classmethod
    def fit(cls, samples: Sequence[KernelSample]) -> RateModel:
        terms = np.array([[1.0, s.flops, s.bytes] for s in samples])
        seconds = np.maximum(np.array([s.seconds for s in samples]), MIN_SECONDS)
        rows = terms / seconds[:, None]  # relative error: (terms @ c) / t - 1
        scale = np.maximum(np.abs(rows).max(axis=0), 1e-300)  # columns span ~20 orders of magnitude
        best, best_residual = np.zeros(3), math.inf
        for size in (1, 2, 3):
            for subset in map(list, itertools.combinations(range(3), size)):
                solution = np.linalg.lstsq(rows[:, subset] / scale[subset], np.ones(len(samples)), rcond=None)[0]
                if (solution < 0).any():
                    continue
                coefficients = np.zeros(3)
                coefficients[subset] = solution / scale[subset]
                residual = float(np.sum((rows @ coefficients - 1.0) ** 2))
                if residual < best_residual:
                    best, best_residual = coefficients, residual
        model = cls(*best)
        model.samples = len(samples)
        return model

    def predict_features(self, x: np.ndarray) -> np.ndarray:
        flops, nbytes = np.expm1(x[:, -2]), np.expm1(x[:, -1])
        overhead, per_flop, per_byte = self.coefficients
        return np.maximum(overhead + per_flop * flops + per_byte * nbytes, MIN_SECONDS)

    def _parameters(self) -> dict:
        overhead, per_flop, per_byte = self.coefficients
        return {"overhead": overhead, "seconds_per_flop": per_flop, "seconds_per_byte": per_byte}

    @classmethod
    def from_dict(cls, data: dict) -> RateModel:
        model = cls(float(data["overhead"]), float(data["seconds_per_flop"]), float(data["seconds_per_byte"]))
        return model._restore_fit_figures(data)


def _check_inputs(x: np.ndarray, expected: int) -> None:
    """Refuse a feature matrix whose dims do not have the length the model was fitted on."""
    if x.shape[1] != expected:
        raise ValueError(f"this model takes {expected - 2} dims, got {x.shape[1] - 2}")


class LogLinearModel(KernelModel):
    """``log(seconds) = w0 + w . features``: a power law of the dims, FLOPs and bytes.

    Where a kernel's time follows its operand sizes but not its FLOPs and bytes (a copy
    whose speed depends on the shape of what it copies; a view that copies nothing), the
    dims carry what :class:`RateModel` cannot see. One straight line in log-log space has
    one slope for all sizes, so it misses the bend from call overhead to linear growth;
    the held-out comparison in :func:`fit_kernel_model` decides per kernel. Fitted by
    least squares on log(seconds), i.e. on relative errors.
    """

    kind = "loglinear"

    def __init__(self, weights: Sequence[float]) -> None:
        super().__init__()
        self.weights = np.asarray(weights, dtype=np.float64)

    @classmethod
    def fit(cls, samples: Sequence[KernelSample]) -> LogLinearModel:
        x, seconds = _matrix(samples)
        design = np.hstack([np.ones((len(x), 1)), x])
        model = cls(np.linalg.lstsq(design, np.log(seconds), rcond=None)[0])
        model.samples = len(samples)
        return model

    def predict_features(self, x: np.ndarray) -> np.ndarray:
        _check_inputs(x, len(self.weights) - 1)
        # A power law fitted on few samples, far outside them, can underflow to 0 s.
        return np.maximum(np.exp(self.weights[0] + x @ self.weights[1:]), MIN_SECONDS)

    def _parameters(self) -> dict:
        return {"weights": self.weights.tolist()}

    @classmethod
    def from_dict(cls, data: dict) -> LogLinearModel:
        return cls(data["weights"])._restore_fit_figures(data)


def _standardise(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and scale of each column; a constant column gets scale 1 (it standardises to 0)."""
    scale = values.std(axis=0)
    return values.mean(axis=0), np.where(scale > 1e-12, scale, 1.0)


class MLPRegressor(KernelModel):
    """Log(seconds) from standardised log sizes by an MLP built from this framework's layers.

    ``hidden`` Dense+ReLU layers (the paper: five of 50 units) and a Dense layer with one
    output, trained in float32. After training the weights are rounded to float16, the
    precision a calibration file stores them in (base64 of the flat parameter array, half
    the bytes of float32), so a model read back predicts exactly what the fitted one did.
    The rounding moves a prediction far less than the timings vary from run to run
    (docs/performance-model.md, 'The models').
    """

    kind = "mlp"

    def __init__(self, network: Network, x_mean: np.ndarray, x_scale: np.ndarray, y_mean: float,
                 y_scale: float) -> None:
        super().__init__()
        self.network = network
        self.x_mean, self.x_scale = np.asarray(x_mean, dtype=np.float64), np.asarray(x_scale, dtype=np.float64)
        self.y_mean, self.y_scale = float(y_mean), float(y_scale)

    @staticmethod
    def _network(inputs: int, hidden: Sequence[int], seed: int) -> Network:
        network = Network("kernel-mlp", (inputs,), 1)
        for units in hidden:
            network.add(Dense(units))
            network.add(ReLU())
        network.add(Dense(1, init="glorot"))
        return network.build(make_backend("cpu", "float32"), seed=seed)

    @classmethod
    def fit(cls, samples: Sequence[KernelSample], seed: int = 0, hidden: Sequence[int] = (50,) * 5,
            batch_size: int = 32, lr: float = 1e-3, max_epochs: int = 1000, patience: int = 20,
            decay_patience: int = 15) -> MLPRegressor:
        """Train on ``samples`` with Adam on the mean squared error of standardised log(seconds).

        A fifth of the samples (chosen with ``seed``) is held out for validation: the
        learning rate is divided by 10 after ``decay_patience`` epochs without a better
        validation loss, training stops after ``patience`` such epochs, and the weights of
        the best validation epoch are kept (the schedule of the paper).
        """
        x, seconds = _matrix(samples)
        y = np.log(seconds)
        x_mean, x_scale = _standardise(x)
        y_mean, y_scale = _standardise(y[:, None])
        model = cls(cls._network(x.shape[1], hidden, seed), x_mean, x_scale, y_mean[0], y_scale[0])
        inputs = ((x - x_mean) / x_scale).astype(np.float32)
        targets = ((y[:, None] - y_mean) / y_scale).astype(np.float32)
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(samples))
        cut = max(1, int(round(HELD_OUT * len(samples))))
        validation, training = order[:cut], order[cut:]
        with in_place():
            model._train(inputs[training], targets[training], inputs[validation], targets[validation], rng,
                         batch_size, lr, max_epochs, patience, decay_patience)
        model.samples = len(samples)
        return model

    def _train(self, x: np.ndarray, y: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
               rng: np.random.Generator, batch_size: int, lr: float, max_epochs: int, patience: int,
               decay_patience: int) -> None:
        network = self.network
        optimizer, loss = Adam(network), MeanSquaredError()
        best_loss, best_params, waited = math.inf, network.flat_params.copy(), 0
        for _ in range(max_epochs):
            order = rng.permutation(len(x))
            for start in range(0, len(x), batch_size):
                rows = order[start:start + batch_size]
                ctx = StepContext(training=True, global_batch=len(rows))
                loss.forward(network.forward(x[rows], ctx), y[rows], ctx)
                network.backward(loss.backward())
                optimizer.step(lr)
            validation_loss = float(np.mean((self._forward(x_val) - y_val) ** 2))
            if validation_loss < best_loss:
                best_loss, waited = validation_loss, 0
                best_params[...] = network.flat_params
                continue
            waited += 1
            if waited == decay_patience:
                lr *= 0.1
            if waited >= patience:
                break
        network.flat_params[...] = best_params.astype(STORED_WEIGHTS)

    def _forward(self, inputs: np.ndarray) -> np.ndarray:
        ctx = StepContext(training=False, global_batch=len(inputs))
        with in_place():
            return self.network.forward(inputs, ctx)

    def predict_features(self, x: np.ndarray) -> np.ndarray:
        _check_inputs(x, len(self.x_mean))
        inputs = ((x - self.x_mean) / self.x_scale).astype(np.float32)
        return np.maximum(np.exp(self._forward(inputs)[:, 0].astype(np.float64) * self.y_scale + self.y_mean),
                          MIN_SECONDS)

    def _parameters(self) -> dict:
        hidden = [layer.units for layer in self.network.layers if isinstance(layer, Dense)][:-1]
        weights = np.ascontiguousarray(self.network.flat_params, dtype=STORED_WEIGHTS)
        return {"hidden": hidden, "x_mean": self.x_mean.tolist(), "x_scale": self.x_scale.tolist(),
                "y_mean": self.y_mean, "y_scale": self.y_scale,
                "weights_float16_base64": base64.b64encode(weights.tobytes()).decode("ascii")}

    @classmethod
    def from_dict(cls, data: dict) -> MLPRegressor:
        x_mean = np.array(data["x_mean"], dtype=np.float64)
        network = cls._network(len(x_mean), data["hidden"], seed=0)
        weights = np.frombuffer(base64.b64decode(data["weights_float16_base64"]), dtype=STORED_WEIGHTS)
        if weights.size != network.flat_params.size:
            raise ValueError(f"an MLP with hidden layers {data['hidden']} has {network.flat_params.size} "
                             f"weights, the file holds {weights.size}")
        network.flat_params[...] = weights
        model = cls(network, x_mean, data["x_scale"], data["y_mean"], data["y_scale"])
        return model._restore_fit_figures(data)


class MLPEnsemble(KernelModel):
    """The paper's MLP, trained ``members`` times with consecutive seeds, predictions
    averaged in log(seconds).

    With a few hundred samples one MLP's error depends on its seed as much as on the
    data, and averaging several evens that out (docs/performance-model.md, 'The models').
    Each member holds out its own fifth for early stopping, so together they learn from
    every sample.
    """

    kind = "mlp_ensemble"

    def __init__(self, members: Sequence[MLPRegressor]) -> None:
        super().__init__()
        self.members = list(members)

    @classmethod
    def fit(cls, samples: Sequence[KernelSample], seed: int = 0, members: int = ENSEMBLE_MEMBERS) -> MLPEnsemble:
        return cls.of_members([MLPRegressor.fit(samples, seed=seed + i) for i in range(members)], len(samples))

    @classmethod
    def of_members(cls, members: Sequence[MLPRegressor], samples: int) -> MLPEnsemble:
        """The ensemble of ``members``, each trained on the same ``samples`` samples."""
        model = cls(members)
        model.samples = samples
        return model

    def predict_features(self, x: np.ndarray) -> np.ndarray:
        return np.exp(np.mean([np.log(member.predict_features(x)) for member in self.members], axis=0))

    def _parameters(self) -> dict:
        return {"members": [member.to_dict() for member in self.members]}

    @classmethod
    def from_dict(cls, data: dict) -> MLPEnsemble:
        return cls([MLPRegressor.from_dict(member) for member in data["members"]])._restore_fit_figures(data)


MODEL_KINDS = {model.kind: model for model in (RateModel, LogLinearModel, MLPRegressor, MLPEnsemble)}
FALLBACKS = (RateModel, LogLinearModel)


def model_from_dict(data: dict) -> KernelModel:
    """Rebuild a model written by ``to_dict``."""
    kind = data.get("kind")
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown kernel model kind {kind!r}: expected one of {', '.join(MODEL_KINDS)}")
    return MODEL_KINDS[kind].from_dict(data)


def _held_out_split(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit, test) indices: a fifth held out for testing once there are at least 5 samples."""
    order = np.random.default_rng(seed).permutation(count)
    cut = int(round(HELD_OUT * count)) if count >= 5 else 0
    return order[cut:], order[:cut]


def held_out_errors(model: KernelModel, test: Sequence[KernelSample]) -> tuple[float, float]:
    """(median relative error, total absolute error / total time) of ``model`` on ``test``."""
    if not test:
        return math.nan, math.nan
    x, seconds = _matrix(test)
    error = np.abs(model.predict_features(x) - seconds)
    return float(np.median(error / seconds)), float(error.sum() / seconds.sum())


def fit_kernel_model(samples: Sequence[KernelSample], seed: int = 0,
                     mlp_min_samples: int = MLP_MIN_SAMPLES) -> KernelModel:
    """The best of the closed-form fallbacks and, given enough samples, an MLP ensemble,
    for one kernel's ``samples``.

    A fifth of the samples is held out; each candidate is fitted on the rest, and the one
    with the lowest mean of its two held-out errors (:func:`held_out_errors`) is kept: it
    must predict the typical call (the median relative error) and the long calls that a
    step spends its time in (the time-weighted error) alike; two models can tie on the
    first and not on the second. The ensemble is a candidate once at least
    ``mlp_min_samples`` samples remain to train it. A kept closed-form model is refitted
    on all samples (a few coefficients: the held-out error stays a fair estimate); a kept
    ensemble stays as trained. The kept model records its held-out errors.

    Both fallbacks stay candidates because neither fits every kernel: the log-linear
    model holds out better for kernels whose time their dims tell better than their bytes
    do (im2col), the rate model for others (docs/performance-model.md, 'The models').
    """
    return _started_fit(samples, seed, mlp_min_samples, _InlineExecutor())()


def fit_kernel_models(samples: Mapping[str, Sequence[KernelSample]], seed: int = 0, workers: int = 1,
                      mlp_min_samples: int = MLP_MIN_SAMPLES) -> dict[str, KernelModel]:
    """:func:`fit_kernel_model` of each kernel's samples, by name.

    With ``workers`` above 1, the members of every kernel's MLP ensemble train at once in
    that many worker processes of one BLAS thread each. Training an MLP is a few thousand
    small steps, bound by Python, not arithmetic: one process fitting a GPU's calibration
    took minutes. The workers are started fresh, not forked, since the calibrating process
    holds MPI's and maybe CUDA's state; each member keeps its seed, so the models equal a
    serial fit's.
    """
    executor: Executor = (ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                              initializer=_one_blas_thread)
                          if workers > 1 else _InlineExecutor())
    with executor:
        finishers = {name: _started_fit(rows, seed, mlp_min_samples, executor) for name, rows in samples.items()}
        return {name: finish() for name, finish in finishers.items()}


def _started_fit(samples: Sequence[KernelSample], seed: int, mlp_min_samples: int,
                 executor: Executor) -> Callable[[], KernelModel]:
    """Start :func:`fit_kernel_model`: the MLP members are handed to ``executor`` now, and the
    returned call finishes the fit once they are trained."""
    if not samples:
        raise ValueError("no samples to fit")
    fit_rows, test_rows = _held_out_split(len(samples), seed)
    fit = [samples[i] for i in fit_rows]
    test = [samples[i] for i in test_rows]
    members = ([executor.submit(_trained_member, fit, seed + i) for i in range(ENSEMBLE_MEMBERS)]
               if len(fit) >= mlp_min_samples else [])

    def finish() -> KernelModel:
        candidates: list[KernelModel] = [kind.fit(fit) for kind in FALLBACKS]
        if members:
            trained = [MLPRegressor.from_dict(member.result()) for member in members]
            candidates.append(MLPEnsemble.of_members(trained, len(fit)))
        scored = [(held_out_errors(model, test), model) for model in candidates]
        # Without held-out samples (NaN errors) the first fallback is kept.
        errors, best = min(scored, key=lambda entry: 0.0 if math.isnan(entry[0][0]) else sum(entry[0]) / 2)
        chosen = best if isinstance(best, MLPEnsemble) else type(best).fit(samples)
        chosen.held_out_error, chosen.held_out_time_error = errors
        return chosen
    return finish


def _trained_member(samples: Sequence[KernelSample], seed: int) -> dict:
    """One ensemble member, trained (in a worker process), as its dict: a model holds its
    backend's array module, which does not pickle."""
    return MLPRegressor.fit(samples, seed=seed).to_dict()


def _one_blas_thread() -> None:
    """A worker's set-up: its MLP's products are far too small to share among threads."""
    from pydtnn_lite.runtime import set_blas_threads

    set_blas_threads(1)


class _InlineExecutor(Executor):
    """Runs each submitted call at once, in this process: the serial fit, through the same code."""

    def submit(self, fn: Callable, /, *args: object, **kwargs: object) -> Future:
        future: Future = Future()
        future.set_result(fn(*args, **kwargs))
        return future
