"""Result payloads: the canonical bytes both sides hash.

A result batch's payload is a JSON array of plugin records. Worker and Gateway hash the same
canonical encoding (orjson, keys sorted), so the Gateway can recompute the sha256 over what it
received and refuse a mismatch.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson


def canonical_payload(records: list[Any]) -> bytes:
    """The canonical bytes of a batch payload."""
    return orjson.dumps(records, option=orjson.OPT_SORT_KEYS)


def payload_sha256(records: list[Any]) -> str:
    """Hex sha256 of the canonical payload."""
    return hashlib.sha256(canonical_payload(records)).hexdigest()
