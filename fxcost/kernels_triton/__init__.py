"""Triton kernels: device-calibration microbenchmarks and reference kernels with known launch configs.

Empty so far; the package exists so the layout of DESIGN.md holds from the start.
"""
