"""The performance model: per-kernel run-time models calibrated on this machine.

Calibration side: :func:`calibrate` measures the kernels of a training step over a grid
of probe networks, the roofs and Allreduce, and fits a :class:`KernelModel` per kernel
(:func:`fit_kernel_model`); a :class:`Calibration` holds the result and its file.
"""
from pydtnn_lite.perfmodel.calibration import Calibration, CalibrationSettings, calibrate, fit_models
from pydtnn_lite.perfmodel.probes import FULL, QUICK, GridSize, Probe, calibration_grid
from pydtnn_lite.perfmodel.regression import (KernelModel, KernelSample, LogLinearModel, MLPRegressor, RateModel,
                                              fit_kernel_model, model_from_dict)
from pydtnn_lite.perfmodel.sampling import h2d_copy_cost

__all__ = ["Calibration", "CalibrationSettings", "calibrate", "fit_models", "FULL", "QUICK", "GridSize", "Probe",
           "calibration_grid", "KernelModel", "KernelSample", "LogLinearModel", "MLPRegressor", "RateModel",
           "fit_kernel_model", "model_from_dict", "h2d_copy_cost"]
