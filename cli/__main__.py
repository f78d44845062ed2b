"""`python -m rlcore.cli` is the same as the `rlcore` command."""

import sys

from .main import main

sys.exit(main())
