"""JSON depth and size limits (domain.limits), pure: where a value stops being acceptable, and
legacy messages nesting too deep are invalid messages, not errors."""

from __future__ import annotations

from uuid import uuid4

import orjson
import pytest

from domain.legacy import InvalidMessage, parse_message
from domain.limits import MAX_FIELD_BYTES, TooDeep, TooLarge, check_body, check_field, depth_exceeds


def nested(levels: int) -> dict[str, object]:
    value: dict[str, object] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def test_depth_counts_containers() -> None:
    assert not depth_exceeds(1, 0) and not depth_exceeds("x", 0)
    assert depth_exceeds({}, 0) and not depth_exceeds({}, 1)
    assert not depth_exceeds({"a": [1]}, 2) and depth_exceeds({"a": [1]}, 1)
    assert not depth_exceeds(nested(32), 32) and depth_exceeds(nested(33), 32)
    assert depth_exceeds([[[[]]]], 3) and depth_exceeds(nested(100_000), 64)  # no recursion limit


def test_fields_are_refused_naming_themselves() -> None:
    check_field("scope", nested(32))
    with pytest.raises(TooDeep) as deep:
        check_field("scope", nested(33))
    assert deep.value.status == 422 and deep.value.details["field"] == "scope"
    with pytest.raises(TooLarge) as large:
        check_field("targets", {"x": "y" * MAX_FIELD_BYTES})
    assert large.value.status == 413 and large.value.details["field"] == "targets"
    check_field("payload", [{"x": "y" * MAX_FIELD_BYTES}])  # payloads: bounded by the body limit only
    with pytest.raises(TooDeep) as body:
        check_body({"ok": 1, "deep": nested(64)})
    assert body.value.details["field"] == "deep"
    check_body({"ok": nested(63)})


@pytest.mark.parametrize("levels", [33, 255, 900])
def test_a_legacy_message_nesting_too_deep_is_invalid(levels: int) -> None:
    raw = orjson.dumps({"scan_id": "L-1", "organization_id": str(uuid4()), "steps": ["probe"],
                        "targets": "DEEP"}).replace(b'"DEEP"', b'{"a":' * levels + b"1" + b"}" * levels)
    with pytest.raises(InvalidMessage, match="targets nests deeper|deeper than the body"):
        parse_message(raw)
