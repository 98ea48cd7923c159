"""Optimizers and learning-rate schedules."""
from pydtnn_lite.optim.adam import Adam
from pydtnn_lite.optim.base import Optimizer
from pydtnn_lite.optim.clipping import clip_by_global_norm
from pydtnn_lite.optim.schedule import LearningRateSchedule
from pydtnn_lite.optim.sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "LearningRateSchedule", "clip_by_global_norm"]
