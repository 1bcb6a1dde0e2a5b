"""``python -m fxcost.cli``: the ``fxcost`` command, as ``python -m fxcost`` runs it."""

import sys

from fxcost.cli import main

sys.exit(main())
