"""Argument types shared by several ``leasehold`` commands."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime


def iso_time(text: str) -> datetime:
    """An ISO 8601 time; without an offset it is UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
