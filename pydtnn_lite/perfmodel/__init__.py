"""Performance model: predict a training step from layer shapes and a machine, and validate it against traces."""
from pydtnn_lite.perfmodel.allreduce import AllreduceModel, Link, allreduce_seconds, fit_allreduce
from pydtnn_lite.perfmodel.clusters import PRESETS, Cluster
from pydtnn_lite.perfmodel.prediction import RooflineMachine, StepPrediction, predict_step
from pydtnn_lite.perfmodel.roofline import Roofline
from pydtnn_lite.perfmodel.validation import Validation, validate

__all__ = ["AllreduceModel", "Link", "allreduce_seconds", "fit_allreduce", "Cluster", "PRESETS", "RooflineMachine",
           "StepPrediction", "predict_step", "Roofline", "Validation", "validate"]
