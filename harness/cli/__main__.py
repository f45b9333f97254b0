"""``python -m harness.cli``: the same as the ``harness`` command (and ``python -m harness``)."""

import sys

from . import main

sys.exit(main())
