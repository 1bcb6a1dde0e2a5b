"""The ``fxcost`` command: demo, profile a model, show a saved trace, compare GPUs, simulate a parallel
plan, measure and train cost models, list devices (``fxcost --help`` lists every subcommand).

``parser`` holds all of the command line; ``step_commands`` and ``data_commands`` the subcommands' functions.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fxcost`` command; returns the exit status."""
    from fxcost.cli.parser import parser

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.run(args) or 0)
    except (ValueError, TypeError, KeyError, FileNotFoundError, RuntimeError) as e:
        print(f"fxcost: error: {e}", file=sys.stderr)
        return 2
