"""``python -m twinkle.server`` is the ``twinkle-server`` command."""

import sys

from twinkle.server.cli import main

sys.exit(main())
