"""What the documentation's tests share: the repository's root and the doc scripts
(``scripts/docs_examples.py``, ``scripts/docs_reference.py``), imported from ``scripts/``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

import docs_examples  # noqa: E402 - found through the path set just above
import docs_reference  # noqa: E402

__all__ = ["ROOT", "docs_examples", "docs_reference"]
