"""How deep and how large JSON may be where it enters: request bodies, the JSON-valued fields the
Gateway stores and hands to workers (a task's scope and parameters, scan and schedule targets,
result payloads), and legacy messages.

Every value accepted here can be encoded again: the JSON parser accepts 1,024 levels of nesting,
the encoder (orjson) stops near 255, so a value that is accepted and stored but cannot be encoded
would break every answer that carries it. Limits are checked before anything is committed, and a
refusal names the field.

Depth counts containers: ``1`` and ``"a"`` have depth 0, ``{}`` and ``[]`` depth 1,
``{"a": [1]}`` depth 2.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import orjson

from leasehold.domain.errors import InvalidRequest, LeaseholdError

#: The deepest a whole request body may nest.
MAX_BODY_DEPTH = 64
#: The deepest a JSON-valued field may nest (counted from the field's own value).
MAX_FIELD_DEPTH = 32
#: The largest (encoded, compact JSON) a task's scope or parameters, or a scan's or schedule's
#: targets, may be.
MAX_FIELD_BYTES = 64 * 1024

#: Per field: (deepest nesting, largest encoded size in bytes; None: bounded by the body limit).
FIELD_LIMITS: dict[str, tuple[int, int | None]] = {
    "scope": (MAX_FIELD_DEPTH, MAX_FIELD_BYTES),
    "parameters": (MAX_FIELD_DEPTH, MAX_FIELD_BYTES),
    "targets": (MAX_FIELD_DEPTH, MAX_FIELD_BYTES),
    "payload": (MAX_FIELD_DEPTH, None),
}


class TooDeep(InvalidRequest):
    """A JSON value nests deeper than its limit."""

    code = "too-deep"


class TooLarge(LeaseholdError):
    """A JSON value is larger than its limit."""

    status = 413
    code = "too-large"


def depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit`` (iterative: no recursion limit, and it stops
    at the first container past the limit)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if level + 1 > limit:
            return True
        stack.extend((child, level + 1) for child in children)
    return False


class _Default(Enum):
    """The type of :data:`DEFAULT`."""

    DEFAULT = "default"


#: ``check_field(..., max_bytes=DEFAULT)``: the field's own limit from :data:`FIELD_LIMITS`.
DEFAULT = _Default.DEFAULT


def check_field(field: str, value: Any, *, max_depth: int | None = None,
                max_bytes: int | None | _Default = DEFAULT) -> None:
    """Refuse ``value`` of ``field`` (TooDeep, TooLarge) when it exceeds the field's limits
    (:data:`FIELD_LIMITS` by the field's last name, or the ones given).

    ``max_bytes=None`` means no size limit (what the Gateway derives itself, such as the scope
    of a profile's next step, is bounded by what produced it, not by the limit on what a client
    may send); left out, the field's own limit applies. Depth is always bounded: ``max_depth``
    None is the field's own limit, since a value nesting deeper than the encoder goes could
    never be answered."""
    default_depth, default_bytes = FIELD_LIMITS.get(field.rsplit(".", 1)[-1], (MAX_FIELD_DEPTH, MAX_FIELD_BYTES))
    depth = default_depth if max_depth is None else max_depth
    size_limit = default_bytes if isinstance(max_bytes, _Default) else max_bytes
    if depth_exceeds(value, depth):
        raise TooDeep(f"{field} nests deeper than {depth} levels", field=field, max_depth=depth)
    if size_limit is not None:
        size = len(orjson.dumps(value))
        if size > size_limit:
            raise TooLarge(f"{field} has {size} bytes encoded, more than {size_limit}", field=field,
                           max_bytes=size_limit)


def check_body(data: dict[str, Any]) -> None:
    """Refuse a parsed request body nesting deeper than :data:`MAX_BODY_DEPTH`, naming the
    top-level field that does (the body object itself is the first level)."""
    for key, value in data.items():
        if depth_exceeds(value, MAX_BODY_DEPTH - 1):
            raise TooDeep(f"{key} nests deeper than the body's limit of {MAX_BODY_DEPTH} levels", field=key,
                          max_depth=MAX_BODY_DEPTH)
