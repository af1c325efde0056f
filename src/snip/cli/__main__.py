"""``python -m snip.cli`` (used by torchrun)."""

import sys

from snip.cli import main

sys.exit(main())
