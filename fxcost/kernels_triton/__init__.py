"""Triton kernels: device-calibration microbenchmarks and reference kernels with known launches.

``kernels`` holds the calibration kernels (STREAM-style copy and triad, an FMA chain, a tiled ``tl.dot``,
an empty kernel, a small-working-set L2 reader) with Python launchers; ``calibrate`` times them and
``device_profile`` writes a device file that :func:`fxcost.gpus.load_devices` accepts; ``reference`` has
elementwise, softmax and layer-norm kernels whose launch is known before they run. None of them is
imported by ``import fxcost``: Triton is loaded only when they are used.
"""
