"""What the diagnoses need to know about the built-in models without building them:
their hidden layer widths, from ``app.core.catalog``."""
from __future__ import annotations

from typing import List, Optional

from app.core.catalog import MODELS

HIDDEN_WIDTHS = {name: list(m.hidden_widths) for name, m in MODELS.items()}


def layer_widths(model: str) -> Optional[List[int]]:
    return HIDDEN_WIDTHS.get(model)
