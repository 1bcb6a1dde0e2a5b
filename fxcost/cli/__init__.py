"""The ``fxcost`` command: demo, profile a model, show a saved trace, compare GPUs, simulate a parallel
plan, measure and train cost models, list devices (``fxcost --help`` lists every subcommand).

``parser`` holds all of the command line; ``step_commands`` and ``data_commands`` the subcommands'
functions; ``status`` the exit statuses.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from fxcost.cli.status import BAD_INPUT, INTERRUPTED, OK

__all__ = ["main"]

# What a command raises for input it cannot use: reported as one line, with status BAD_INPUT. Anything
# else is a fault of fxcost's and keeps its traceback.
_INPUT_ERRORS = (ValueError, TypeError, KeyError, OSError, ImportError, RuntimeError)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fxcost`` command; returns the exit status (:mod:`fxcost.cli.status`)."""
    from fxcost.cli.parser import parser

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.run(args) or OK)
    except _INPUT_ERRORS as e:
        # A KeyError's str() is its key's repr, quotes and all.
        message = str(e.args[0] if isinstance(e, KeyError) and e.args else e)
        print(f"fxcost: error: {' '.join(message.split())}", file=sys.stderr)
        return BAD_INPUT
    except KeyboardInterrupt:
        print("fxcost: interrupted", file=sys.stderr)
        return INTERRUPTED
