"""The performance model: per-kernel regressions calibrated on this machine."""
