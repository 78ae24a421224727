"""``python -m linear_attention.sweep``: see README.md, "Sweeps"."""

import sys

from linear_attention.sweep.cli import main

sys.exit(main())
