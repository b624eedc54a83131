"""The one serialization path for events: eventsourcing's mapper with an orjson transcoder.

Stored state is compact JSON (orjson) of the event's fields minus its stream position, plus
``class_version`` when above 1. Reading resolves the topic to the event class, runs the class's
``upcast_vN_vN+1`` functions (eventsourcing's convention) and validates with pydantic.
"""

from __future__ import annotations

from typing import Any, cast

import orjson
from eventsourcing.persistence import Mapper, StoredEvent, Transcoder, Transcoding
from eventsourcing.utils import get_topic, resolve_topic

from domain.events import DomainEvent

_POSITION = ("originator_id", "originator_version")


class OrjsonTranscoder(Transcoder):
    """JSON via orjson; UUIDs and datetimes are native to it, pydantic restores the types."""

    def encode(self, obj: Any) -> bytes:
        return orjson.dumps(obj)

    def decode(self, data: bytes) -> Any:
        return orjson.loads(data)

    def register(self, transcoding: Transcoding) -> None:  # pragma: no cover - not used
        raise NotImplementedError("events are pydantic models; no transcodings are needed")


class EventMapper(Mapper[Any]):
    """Maps pydantic domain events to eventsourcing ``StoredEvent`` objects and back."""

    def __init__(self) -> None:
        super().__init__(transcoder=OrjsonTranscoder())

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        event = cast(DomainEvent, domain_event)
        state = {k: v for k, v in event.__dict__.items() if k not in _POSITION}
        class_version = type(event).class_version
        if class_version > 1:
            state["class_version"] = class_version
        return StoredEvent(
            originator_id=event.originator_id,
            originator_version=event.originator_version,
            topic=topic_of(type(event)),
            state=self.transcoder.encode(state),
        )

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        cls = cast(type[DomainEvent], resolve_topic(stored_event.topic))
        state: dict[str, Any] = self.transcoder.decode(stored_event.state)
        from_version = state.pop("class_version", 1)
        while from_version < cls.class_version:
            getattr(cls, f"upcast_v{from_version}_v{from_version + 1}")(state)
            from_version += 1
        state["originator_id"] = stored_event.originator_id
        state["originator_version"] = stored_event.originator_version
        return cls.model_validate(state)


_TOPICS: dict[type, str] = {}


def topic_of(cls: type) -> str:
    """eventsourcing's topic (``module:Class``) of an event class, cached."""
    topic = _TOPICS.get(cls)
    if topic is None:
        topic = _TOPICS[cls] = get_topic(cls)
    return topic


MAPPER = EventMapper()
