"""Asserting a refusal exactly: its error class and its whole message.

The message of a domain error is the ``detail`` a client reads in the problem+json answer, so
unit tests compare all of it (``pytest.raises(match=…)`` alone would accept any message that
merely contains the expected words).
"""

from __future__ import annotations

import re
from typing import Any

import pytest


def refused(error: type[BaseException], message: str) -> Any:
    """``pytest.raises`` for ``error`` whose message is exactly ``message``."""
    return pytest.raises(error, match=f"^{re.escape(message)}$")
