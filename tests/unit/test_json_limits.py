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
from leasehold.domain.limits import (
    MAX_BODY_DEPTH,
    MAX_FIELD_BYTES,
    MAX_FIELD_DEPTH,
    TooDeep,
    TooLarge,
    check_body,
    check_field,
    depth_exceeds,
)
from leasehold.gateway.api.operator_models import CLIPPED, clip
from leasehold.protocol.clipping import CLIPPED_NUMBER


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
    assert body.value.details == {"field": "deep", "max_depth": MAX_BODY_DEPTH}
    assert body.value.message == f"deep nests deeper than the body's limit of {MAX_BODY_DEPTH} levels"
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


def sized(n: int) -> dict[str, str]:
    """An object whose compact JSON is exactly ``n`` bytes (``{"x":"…"}``)."""
    return {"x": "y" * (n - len('{"x":""}'))}


@pytest.mark.parametrize("field", ["scope", "parameters", "targets", "task.scope", "a.b.parameters",
                                   "not-a-listed-field", "a.b.unlisted"])
def test_a_client_sent_field_keeps_its_size_limit_to_the_byte(field: str) -> None:
    """Scope, parameters and targets, under any prefix, and a field the table does not list, are
    limited to MAX_FIELD_BYTES encoded: at the limit accepted, one byte more refused, naming the
    field, its size and the limit."""
    check_field(field, sized(MAX_FIELD_BYTES))
    with pytest.raises(TooLarge) as large:
        check_field(field, sized(MAX_FIELD_BYTES + 1))
    assert large.value.message == f"{field} has {MAX_FIELD_BYTES + 1} bytes encoded, more than {MAX_FIELD_BYTES}"
    assert large.value.details == {"field": field, "max_bytes": MAX_FIELD_BYTES}


@pytest.mark.parametrize("field", ["payload", "batch.payload", "a.b.payload"])
def test_a_field_listed_without_a_size_limit_has_none_not_the_default(field: str) -> None:
    """"No limit" in FIELD_LIMITS means none (the body limit bounds it), never the default size."""
    check_field(field, sized(4 * MAX_FIELD_BYTES))
    with pytest.raises(TooDeep):  # its depth limit still holds
        check_field(field, nested(MAX_FIELD_DEPTH + 1))


def test_limits_given_by_the_caller_replace_the_fields_own() -> None:
    check_field("scope", sized(10), max_bytes=10)
    with pytest.raises(TooLarge) as large:
        check_field("scope", sized(11), max_bytes=10)
    assert large.value.details == {"field": "scope", "max_bytes": 10}
    check_field("payload", sized(10), max_bytes=10)
    with pytest.raises(TooLarge):  # a limit given applies where the table has none
        check_field("payload", sized(11), max_bytes=10)
    check_field("scope", sized(MAX_FIELD_BYTES + 100), max_bytes=MAX_FIELD_BYTES + 100)

    check_field("scope", nested(4), max_depth=4)
    with pytest.raises(TooDeep) as deep:
        check_field("scope", nested(5), max_depth=4)
    assert deep.value.message == "scope nests deeper than 4 levels"
    assert deep.value.details == {"field": "scope", "max_depth": 4}
    check_field("scope", nested(MAX_FIELD_DEPTH + 8), max_depth=MAX_FIELD_DEPTH + 8)


def test_a_refusal_for_depth_names_the_field_and_its_limit() -> None:
    with pytest.raises(TooDeep) as deep:
        check_field("a.scope", [nested(MAX_FIELD_DEPTH)])
    assert deep.value.message == f"a.scope nests deeper than {MAX_FIELD_DEPTH} levels"
    assert deep.value.details == {"field": "a.scope", "max_depth": MAX_FIELD_DEPTH}
    check_field("a.scope", 1)  # scalars have no depth
    check_field("a.scope", None)


@pytest.mark.parametrize("levels", [33, 255, 900])
def test_a_legacy_message_nesting_too_deep_is_invalid(levels: int) -> None:
    raw = orjson.dumps({"scan_id": "L-1", "organization_id": str(uuid4()), "steps": ["probe"],
                        "targets": "DEEP"}).replace(b'"DEEP"', b'{"a":' * levels + b"1" + b"}" * levels)
    with pytest.raises(InvalidMessage, match="targets nests deeper|deeper than the body"):
        parse_message(raw)


# --- clipping what an answer shows (gateway.api.operator_models.clip) ---------------------------

#: JSON values an answer can hold: integers within 64 bits (larger ones are clipped as numbers,
#: see the test after the next).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.text(max_size=3),
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


def test_clip_replaces_an_integer_past_64_bits_and_keeps_the_edges() -> None:
    value = {"big": 2**64, "small": -(2**63) - 1, "edges": [2**64 - 1, -(2**63)], "flag": True}
    assert clip(value, 5) == ({"big": CLIPPED_NUMBER, "small": CLIPPED_NUMBER,
                               "edges": [2**64 - 1, -(2**63)], "flag": True}, True)
