"""``python -m harness.services.proxy``: the fault proxy's command (see :mod:`.server`)."""

import sys

from .server import main

if __name__ == "__main__":
    sys.exit(main())
