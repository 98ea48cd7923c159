"""The layer library: one class per layer, written once for NumPy and CuPy."""
from pydtnn_lite.layers.activation import ReLU
from pydtnn_lite.layers.base import Layer, StepContext
from pydtnn_lite.layers.batchnorm import BatchNorm
from pydtnn_lite.layers.conv import Conv2D
from pydtnn_lite.layers.dense import Dense
from pydtnn_lite.layers.dropout import Dropout
from pydtnn_lite.layers.loss import MeanSquaredError, SoftmaxCrossEntropy
from pydtnn_lite.layers.merge import Add, Concat
from pydtnn_lite.layers.pooling import AvgPool2D, GlobalAvgPool2D, MaxPool2D
from pydtnn_lite.layers.reshape import Flatten

__all__ = ["Layer", "StepContext", "Conv2D", "Dense", "MaxPool2D", "AvgPool2D",
           "GlobalAvgPool2D", "BatchNorm", "ReLU", "Flatten", "Dropout", "Add", "Concat",
           "SoftmaxCrossEntropy", "MeanSquaredError"]
