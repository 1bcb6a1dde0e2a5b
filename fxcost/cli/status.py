"""The exit statuses of the ``fxcost`` command, each with what it means: ``fxcost --help`` lists
them (:data:`EXIT_STATUSES`), and the commands return them by these names, never as bare numbers."""

from __future__ import annotations

__all__ = ["BAD_INPUT", "EXIT_STATUSES", "INTERNAL_ERROR", "INTERRUPTED", "OK", "OUT_OF_MEMORY"]

OK = 0
# Python's own status for an exception nothing catches: a fault inside fxcost, not in what it was given.
INTERNAL_ERROR = 1
# argparse's status for a usage error; fxcost uses it for every input it cannot use.
BAD_INPUT = 2
OUT_OF_MEMORY = 3
INTERRUPTED = 130  # the shell's 128 + SIGINT

EXIT_STATUSES: dict[int, str] = {
    OK: "success",
    INTERNAL_ERROR: "an unexpected error inside fxcost (a bug: the traceback follows)",
    BAD_INPUT: "bad input: a usage error, or an argument, file or model fxcost cannot use "
    "(one line on stderr says which, and what is accepted)",
    OUT_OF_MEMORY: "simulate: a rank of the plan runs out of GPU memory (the result is printed)",
    INTERRUPTED: "interrupted (Ctrl-C)",
}
