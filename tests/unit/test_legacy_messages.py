"""Legacy queue messages (domain/legacy.py): what a valid message is, what the drain makes of it,
and why an invalid one is refused. (The drain itself runs against Redis and PostgreSQL in
tests/test_legacy_drain.py.)"""

from __future__ import annotations

import hashlib
from typing import Any
from uuid import UUID

import orjson
import pytest

from leasehold.domain.errors import InvalidRequest
from leasehold.domain.events import ProfileStep
from leasehold.domain.legacy import MAX_MESSAGE_BYTES, InvalidMessage, parse_message
from support.refusals import refused

ORG = UUID(int=7)


def message(**fields: Any) -> dict[str, Any]:
    return {"scan_id": "L-1", "organization_id": str(ORG), "targets": ["10.0.0.5", "example.com"],
            "profile": "default", **fields}


def parse(body: dict[str, Any]) -> Any:
    return parse_message(orjson.dumps(body))


def test_a_message_with_a_profile_name() -> None:
    parsed = parse(message(producer="legacy-api v2"))  # unknown fields are ignored
    assert (parsed.legacy_scan_id, parsed.organization_id, parsed.profile_name, parsed.steps) == (
        "L-1", ORG, "default", ())
    assert parsed.targets == {"targets": ["10.0.0.5", "example.com"]}  # a list is short for {"targets": [...]}


def test_a_message_with_steps_as_names_or_objects() -> None:
    parsed = parse(message(profile=None, steps=["tcp-connect", {"task_type": "http-probe", "max_attempts": 2}],
                           targets={"targets": ["h"], "ports": [443]}))
    assert parsed.profile_name is None
    assert parsed.steps == (ProfileStep(task_type="tcp-connect"), ProfileStep(task_type="http-probe", max_attempts=2))
    assert parsed.targets == {"targets": ["h"], "ports": [443]}


def test_an_integer_scan_id_is_read_as_its_text() -> None:
    assert parse(message(scan_id=12345)).legacy_scan_id == "12345"


def test_the_identity_of_a_message_ignores_its_formatting() -> None:
    body = message()
    compact = orjson.dumps(body)
    spaced = b'{ "profile" : "default",\n "targets": ["10.0.0.5", "example.com"], "organization_id": "' + \
        str(ORG).encode() + b'", "scan_id": "L-1" }'
    expected = hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert parse_message(compact).sha256 == parse_message(spaced).sha256 == expected
    assert parse(message(extra=1)).sha256 != expected  # every field counts, ignored or not


@pytest.mark.parametrize(("raw", "reason"), [
    (b"{not json", "not JSON"),
    (b'["a", "list"]', "a message is a JSON object, not list"),
    (b'"text"', "a message is a JSON object, not str"),
])
def test_a_message_that_is_not_a_json_object_is_refused(raw: bytes, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        parse_message(raw)


def test_an_oversized_message_is_refused_before_it_is_read() -> None:
    raw = b" " * (MAX_MESSAGE_BYTES + 1)
    with pytest.raises(InvalidMessage, match=f"more than {MAX_MESSAGE_BYTES}"):
        parse_message(raw)
    padded = orjson.dumps(message())
    assert parse_message(padded + b" " * (MAX_MESSAGE_BYTES - len(padded))).legacy_scan_id == "L-1"


@pytest.mark.parametrize(("fields", "reason"), [
    ({"organization_id": None}, "organization_id"),
    ({"organization_id": "not a uuid"}, "organization_id"),
    ({"scan_id": ""}, "scan_id"),
    ({"scan_id": "L" * 201}, "scan_id"),
    ({"scan_id": 1.5}, "scan_id"),
    ({"targets": "10.0.0.5"}, "targets"),
    ({"targets": [1, 2]}, "targets"),
    ({"profile": ""}, "profile"),
    ({"profile": "p" * 101}, "profile"),
])
def test_a_field_of_the_wrong_shape_is_named_in_the_refusal(fields: dict[str, Any], reason: str) -> None:
    body = {k: v for k, v in message(**fields).items() if v is not None}
    with pytest.raises(InvalidMessage, match=reason):
        parse(body)


def test_the_refusal_says_where_each_problem_is() -> None:
    """Each problem is ``place: what``, the place's parts joined by dots, the problems by "; "
    (the wording of each ``what`` is pydantic's)."""
    with pytest.raises(InvalidMessage) as raised:
        parse({"scan_id": "L-1", "targets": ["a", 2], "profile": "p"})
    places = [part.split(": ")[0] for part in raised.value.message.split("; ")]
    assert places == ["organization_id", "targets.dict[str,any]", "targets.list[str].1"]


def test_the_refusal_lists_at_most_five_problems_with_their_places() -> None:
    body = {"scan_id": 1.5, "targets": [1, 2, 3, 4, 5, 6], "steps": [7]}
    with pytest.raises(InvalidMessage) as raised:
        parse(body)
    parts = raised.value.message.split("; ")
    assert len(parts) == 5
    assert all(": " in part for part in parts)
    assert parts[0].startswith("scan_id")


def test_a_message_needs_exactly_one_of_profile_and_steps() -> None:
    both = "give exactly one of profile (a stored profile's name) and steps"
    with refused(InvalidMessage, both):
        parse(message(steps=["probe"]))
    with refused(InvalidMessage, both):
        parse({k: v for k, v in message().items() if k != "profile"})


@pytest.mark.parametrize("steps", [[], [{"task_type": "p", "lease_seconds": 0}], [""]])
def test_steps_follow_the_profile_rules(steps: list[Any]) -> None:
    with pytest.raises(InvalidMessage, match="^steps: "):
        parse(message(profile=None, steps=steps))


def test_an_invalid_message_is_an_invalid_request_with_its_own_code() -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse_message(b"[]")
    assert raised.value.code == "invalid-legacy-message" and raised.value.status == 422
