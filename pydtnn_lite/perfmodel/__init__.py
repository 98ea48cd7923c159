"""The performance model: calibrate a machine, predict a training step kernel by kernel, validate against traces.

Calibration: :func:`calibrate` measures the kernels of a training step over a grid of
probe networks, the roofs and Allreduce, and fits a :class:`KernelModel` per kernel
(:func:`fit_kernel_model`); a :class:`Calibration` holds the result and its file.
Prediction: :func:`predict_step` walks a network's kernels on a machine model (a
roofline, a calibration) with an Allreduce model (:func:`fit_allreduce`, :class:`InterpolatedAllreduce`); validation
(:func:`validate`) matches the prediction with a trace.
"""
from pydtnn_lite.perfmodel.allreduce import (AllreduceModel, InterpolatedAllreduce, Link, allreduce_seconds,
                                             fit_allreduce)
from pydtnn_lite.perfmodel.calibration import Calibration, CalibrationSettings, calibrate, fit_models
from pydtnn_lite.perfmodel.clusters import PRESETS, Cluster
from pydtnn_lite.perfmodel.prediction import RooflineMachine, StepPrediction, predict_step
from pydtnn_lite.perfmodel.probes import FULL, QUICK, GridSize, Probe, calibration_grid
from pydtnn_lite.perfmodel.regression import (KernelModel, KernelSample, LogLinearModel, MLPEnsemble, MLPRegressor,
                                              RateModel, fit_kernel_model, model_from_dict)
from pydtnn_lite.perfmodel.roofline import Roofline
from pydtnn_lite.perfmodel.sampling import h2d_copy_cost
from pydtnn_lite.perfmodel.validation import Validation, validate

__all__ = ["AllreduceModel", "InterpolatedAllreduce", "Link", "allreduce_seconds", "fit_allreduce", "Calibration",
           "CalibrationSettings", "calibrate", "fit_models", "Cluster", "PRESETS", "RooflineMachine", "StepPrediction", "predict_step",
           "FULL", "QUICK", "GridSize", "Probe", "calibration_grid", "KernelModel", "KernelSample", "LogLinearModel",
           "MLPEnsemble", "MLPRegressor", "RateModel", "fit_kernel_model", "model_from_dict", "Roofline", "h2d_copy_cost",
           "Validation", "validate"]
