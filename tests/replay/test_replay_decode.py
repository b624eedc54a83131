"""Decoding a stored event (:func:`persistence.codec.decode_event`, the one path every reader
uses): old states are upcast, everything is validated in full, and anything that is not a valid
domain event is a :class:`DecodeError` that names the stream, version and topic."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar
from uuid import UUID, uuid4

import orjson
import pytest

from leasehold.domain.events import DomainEvent, TaskCancelled
from leasehold.persistence.codec import MAPPER, DecodeError, decode_event, topic_of

STREAM = UUID("00000000-0000-4000-8000-000000000001")
AT = datetime(2030, 1, 1, tzinfo=UTC)


class RenamedField(DomainEvent):
    """An event whose second version renamed ``why`` to ``reason``."""

    class_version: ClassVar[int] = 2
    reason: str

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        state["reason"] = state.pop("why")


class MissingUpcaster(DomainEvent):
    class_version: ClassVar[int] = 3
    reason: str

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        pass


def cancelled() -> TaskCancelled:
    return TaskCancelled(originator_id=STREAM, originator_version=4, timestamp=AT, actor="operator:k",
                         scan_job_id=uuid4(), attempt_id=uuid4(), reason="operator asked")


def test_an_encoded_event_decodes_to_an_equal_event() -> None:
    event = cancelled()
    stored = MAPPER.to_stored_event(event)
    decoded = decode_event(stored.originator_id, stored.originator_version, stored.topic, stored.state)
    assert decoded == event and type(decoded) is TaskCancelled
    assert MAPPER.to_domain_event(stored) == event  # eventsourcing's readers take the same path


def test_an_old_state_is_upcast_to_the_current_class_version() -> None:
    old = orjson.dumps({"timestamp": AT, "actor": "system", "why": "renamed since"})
    event = decode_event(STREAM, 1, topic_of(RenamedField), old)
    assert isinstance(event, RenamedField) and event.reason == "renamed since"
    current = MAPPER.to_stored_event(event)
    assert orjson.loads(current.state)["class_version"] == 2
    assert decode_event(STREAM, 1, current.topic, current.state) == event


def state_of(event: DomainEvent, **changes: Any) -> bytes:
    state = orjson.loads(MAPPER.to_stored_event(event).state)
    state.update(changes)
    return orjson.dumps({k: v for k, v in state.items() if v is not ...})


TOPIC = topic_of(TaskCancelled)


@pytest.mark.parametrize(("topic", "state", "because"), [
    (TOPIC, b"{not json", "not JSON"),
    (TOPIC, b"[1, 2]", "not a JSON object"),
    (TOPIC, state_of(cancelled(), reason=...), "a required field is missing"),
    (TOPIC, state_of(cancelled(), attempt_id="not-a-uuid"), "a field has the wrong type"),
    (TOPIC, state_of(cancelled(), injected=True), "a field the event does not have"),
    ("domain.events:NoSuchEvent", state_of(cancelled()), "the topic names no class"),
    ("no_such_module:TaskCancelled", state_of(cancelled()), "the topic names no module"),
    ("uuid:UUID", state_of(cancelled()), "the topic names a class that is not an event"),
    (topic_of(MissingUpcaster), orjson.dumps({"timestamp": AT, "actor": "system", "reason": "r"}),
     "no upcaster leads to the current class version"),
])
def test_a_state_that_is_not_a_valid_event_is_a_decode_error(topic: str, state: bytes, because: str) -> None:
    with pytest.raises(DecodeError, match=rf"^stream {STREAM} v4 \({topic}\) does not decode: .+"):
        decode_event(STREAM, 4, topic, state)
