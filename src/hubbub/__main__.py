"""``python -m hubbub``."""

from __future__ import annotations

import sys

from hubbub.cli import main

sys.exit(main())
