"""Where things are, for every test and benchmark: the one definition of the repository root.

Tests import it as ``tests.paths`` (pytest puts the root on ``sys.path``, tests/ being a
package).  Benchmarks run as scripts (``python3 tests/benchmarks/X.py``) put tests/ on
``sys.path`` and import it as ``paths``; :func:`root_on_path` then lets them import this
checkout's ``app``.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "tests" / "unit"
# The user-model files (tests/unit/user_models/), importable as user_models.X with UNIT on the path.
USER_MODELS = UNIT / "user_models"


def root_on_path() -> Path:
    """Put the repository root first on ``sys.path`` (once) and return it."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return ROOT
