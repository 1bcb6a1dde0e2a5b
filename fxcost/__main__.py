"""``python -m fxcost``: the ``fxcost`` command, for environments where the script is not installed."""

import sys

from fxcost.cli import main

sys.exit(main())
