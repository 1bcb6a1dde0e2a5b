"""The report of a captured step: the trace file (:class:`Report`), its printout, exports, batch
extrapolation and the choice of GPU to rent."""

from fxcost.report.trace import SCHEMA_VERSION, Report, TraceFormatError

__all__ = ["SCHEMA_VERSION", "Report", "TraceFormatError"]
