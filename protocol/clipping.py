"""Stored JSON shown safely: a value stored before the input limits may nest deeper, or hold a
larger number, than a JSON answer can; :func:`clip` replaces those parts by markers and says
whether it did. Pure, shared by the Gateway's answers and the audit tools' output."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["CLIPPED", "CLIPPED_NUMBER", "MAX_DISPLAY_DEPTH", "clip"]

#: How deep an event's payload is shown: twice what the input limits admit in any field today
#: (domain.limits), and shallow enough that a page of events always encodes (orjson stops at 254
#: levels). Only values stored before those limits existed can nest deeper.
MAX_DISPLAY_DEPTH = 128
#: What stands in for a container nested deeper than :data:`MAX_DISPLAY_DEPTH`.
CLIPPED = "(nested too deep to show here)"
#: What stands in for an integer JSON answers cannot hold (outside 64 bits; jsonb keeps any, and
#: only values stored before the input limits can hold one).
CLIPPED_NUMBER = "(number too large to show here)"
_SMALLEST, _LARGEST = -(2**63), 2**64 - 1


def clip(value: Any, limit: int = MAX_DISPLAY_DEPTH) -> tuple[Any, bool]:
    """``value`` with every container deeper than ``limit`` (the outermost is depth 1) replaced by
    :data:`CLIPPED` and every integer past 64 bits by :data:`CLIPPED_NUMBER`, and whether anything
    was. Iterative, so it never meets Python's own limit."""
    clipped = False

    def copy(item: Any, depth: int) -> Any:
        nonlocal clipped
        if isinstance(item, Mapping | list | tuple):
            if depth > limit:
                clipped = True
                return CLIPPED
            return {} if isinstance(item, Mapping) else []
        if isinstance(item, int) and not isinstance(item, bool) and not _SMALLEST <= item <= _LARGEST:
            clipped = True
            return CLIPPED_NUMBER
        return item

    root = copy(value, 1)
    stack = [(value, root, 1)] if isinstance(root, dict | list) else []
    while stack:
        source, target, depth = stack.pop()
        items = source.items() if isinstance(source, Mapping) else enumerate(source)
        for key, item in items:
            child = copy(item, depth + 1)
            if isinstance(child, dict | list):
                stack.append((item, child, depth + 1))
            if isinstance(target, dict):
                target[key] = child
            else:
                target.append(child)
    return root, clipped
