"""The measuring side of the performance model: everything that runs code on this machine.

Probe networks (``probes.py``) trained under the tracer and paired with their analytic
costs (``sampling.py``), the roofs and the cache evictor (``host.py``), Allreduce timings
(``allreduce_timing.py``), and the calibration procedure that runs them all and fits the
kernel models (``calibrate.py``). Import from the modules.
"""
