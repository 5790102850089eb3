"""pytest set-up: the numpy reference forward pass (reference/model.py) importable by name."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "reference"))
