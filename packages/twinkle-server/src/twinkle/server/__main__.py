"""``python -m twinkle.server`` is the ``twinkle-server`` command."""

import sys

from twinkle.server.process.cli import main

sys.exit(main())
