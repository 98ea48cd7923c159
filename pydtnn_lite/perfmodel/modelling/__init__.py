"""The modelling side of the performance model: pure functions of layer shapes, trace records and a calibration.

The calibration record and its file (``calibration.py``) and the merging of several
(``merging.py``), per-kernel regressions
(``regression.py``), the roofline, Allreduce and synchronisation models, the machines a
prediction assumes (presets, flags, calibrations), the prediction of a step, its
validation against a trace, the reports and the scalability study. Nothing here runs a
probe, a communicator or the trainer. Import from the modules.
"""
