"""The performance model: calibrate a machine, predict a training step kernel by kernel, validate against traces.

Two subpackages, kept apart so that predicting and validating load no code that runs on
the machine (no trainer, tracer or MPI):

- :mod:`~pydtnn_lite.perfmodel.measuring` runs code on this machine: probe networks
  under the tracer, the roofs, Allreduce timings, and ``calibrate``, which measures them
  and fits the kernel models;
- :mod:`~pydtnn_lite.perfmodel.modelling` holds pure functions of layer shapes, trace
  records and a calibration: the calibration record and its file, the kernel
  regressions, the roofline, Allreduce and synchronisation models, machines, prediction,
  validation, reports and the scalability study.

The packages import nothing themselves: import from their modules.
"""
