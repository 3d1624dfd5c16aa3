"""Shared test set-up: folders mirror the package; `cases` holds the closed-form problems."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
