"""JSON depth and size limits (domain.limits), pure: where a value stops being acceptable, and
legacy messages nesting too deep are invalid messages, not errors."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from leasehold.domain.legacy import InvalidMessage, parse_message
from leasehold.domain.limits import MAX_FIELD_BYTES, TooDeep, TooLarge, check_body, check_field, depth_exceeds
from leasehold.gateway.api.operator_models import CLIPPED, clip


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


def test_no_size_limit_means_none_and_leaving_it_out_means_the_fields_own() -> None:
    """``max_bytes=None`` is "no limit" (what the Gateway derives: a profile step's scope of every
    asset found so far); only leaving it out applies the limit meant for what clients send."""
    large = {"assets": [{"kind": "service", "value": f"127.0.0.1:{port}/tcp"} for port in range(1, 1601)]}
    assert len(orjson.dumps(large)) > MAX_FIELD_BYTES
    check_field("scope", large, max_bytes=None)
    with pytest.raises(TooLarge):
        check_field("scope", large)
    with pytest.raises(TooDeep):  # depth stays bounded either way
        check_field("scope", nested(33), max_bytes=None)


@pytest.mark.parametrize("levels", [33, 255, 900])
def test_a_legacy_message_nesting_too_deep_is_invalid(levels: int) -> None:
    raw = orjson.dumps({"scan_id": "L-1", "organization_id": str(uuid4()), "steps": ["probe"],
                        "targets": "DEEP"}).replace(b'"DEEP"', b'{"a":' * levels + b"1" + b"}" * levels)
    with pytest.raises(InvalidMessage, match="targets nests deeper|deeper than the body"):
        parse_message(raw)


# --- clipping what an answer shows (gateway.api.operator_models.clip) ---------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=30)


@given(json_values, st.integers(min_value=1, max_value=6))
def test_clip_keeps_what_fits_and_bounds_the_rest(value: Any, limit: int) -> None:
    shown, clipped = clip(value, limit)
    assert clipped == depth_exceeds(value, limit)
    assert not depth_exceeds(shown, limit)
    if not clipped:
        assert shown == value
    assert clip(value, 100) == (value, False)


def test_clip_replaces_each_too_deep_container_in_place() -> None:
    value = {"keep": [1, {"x": 2}], "deep": [[["gone"]], 3], "n": 4}
    assert clip(value, 2) == ({"keep": [1, CLIPPED], "deep": [CLIPPED, 3], "n": 4}, True)
    assert clip(tuple([1, (2,)]), 1) == ([1, CLIPPED], True)
    assert clip("plain", 1) == ("plain", False)
