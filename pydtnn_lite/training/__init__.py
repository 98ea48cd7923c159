"""Training: the data-parallel step and loop, checkpoints and history."""
from pydtnn_lite.training.checkpoint import load_checkpoint, save_checkpoint
from pydtnn_lite.training.history import History
from pydtnn_lite.training.observer import TrainingObserver
from pydtnn_lite.training.trainer import Batch, StepCallback, StepResult, Trainer, TrainerSettings, build_trainer

__all__ = ["Trainer", "TrainerSettings", "Batch", "StepResult", "StepCallback", "build_trainer", "TrainingObserver",
           "History", "save_checkpoint", "load_checkpoint"]
