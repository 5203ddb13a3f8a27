"""``python -m providers.sim``."""

import sys

from providers.sim.cli import main

sys.exit(main())
