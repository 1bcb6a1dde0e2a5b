"""fxcost's version: one home, read by the package, the trace files and the build (pyproject.toml)."""

__version__ = "0.1.0"
