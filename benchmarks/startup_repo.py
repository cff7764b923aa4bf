"""The repository root (REPO), put on sys.path so that the benchmarks import `singpy` and `tests` from it."""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, sys.path[0] is benchmarks/: the repository root makes `singpy` and `tests` importable from it.
if (_repo := str(Path(__file__).resolve().parent.parent)) not in sys.path:
    sys.path.insert(0, _repo)

REPO = Path(_repo)
