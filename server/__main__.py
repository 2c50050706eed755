"""``python -m server``: the same as the ``huddle`` command."""

import sys

from server.cli import main

sys.exit(main())
