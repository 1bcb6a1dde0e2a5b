"""Triton kernels: device-calibration microbenchmarks.

``kernels`` holds the Triton kernels (STREAM-style copy and triad, an FMA chain, an empty kernel, a
small-working-set L2 reader) with Python launchers; ``calibrate`` times them and writes a device profile
that :func:`fxcost.devices.load_devices` accepts. Neither module is imported by ``import fxcost``:
Triton is loaded only when a calibration runs.
"""
