"""``python -m harness``: the same as the ``harness`` command."""

import sys

from .cli import main

sys.exit(main())
