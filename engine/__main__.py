"""`python -m engine`: the same entry as the `lockstep-engine` console script."""

import sys

from engine.cli import main

sys.exit(main())
