"""The one serialization path for events: eventsourcing's mapper with an orjson transcoder.

Stored state is compact JSON (orjson) of the event's fields minus its stream position (and minus
its sparse fields while at their default), plus ``class_version`` when above 1. Reading (:func:`decode_event`, which the mapper's
``to_domain_event`` also uses) resolves the topic to the event class, runs the class's
``upcast_vN_vN+1`` functions (eventsourcing's convention) and validates with pydantic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast
from uuid import UUID

import orjson
from eventsourcing.persistence import Mapper, StoredEvent, Transcoder, Transcoding
from eventsourcing.utils import TopicError, get_topic, register_topic, resolve_topic

from leasehold.domain import events as domain_events
from leasehold.domain.events import DomainEvent

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
        cls = type(event)
        for name in cls.sparse_fields:  # left out at their default: see DomainEvent.sparse_fields
            if state[name] == cls.model_fields[name].default:
                del state[name]
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
        return decode_event(stored_event.originator_id, stored_event.originator_version, stored_event.topic,
                            stored_event.state)


_TOPICS: dict[type, str] = {}
#: Stored topics name our modules without the package's name (``domain.events:TaskLeased``): the
#: log was first written so, and a topic is hashed into its stream's chain, so it never changes.
_PACKAGE = "leasehold."
register_topic(domain_events.__name__.removeprefix(_PACKAGE), domain_events)


def topic_of(cls: type) -> str:
    """eventsourcing's topic (``module:Class``) of an event class, cached; ours without the
    ``leasehold.`` prefix (see :data:`_PACKAGE`)."""
    topic = _TOPICS.get(cls)
    if topic is None:
        topic = _TOPICS[cls] = get_topic(cls).removeprefix(_PACKAGE)
    return topic


class DecodeError(ValueError):
    """A stored event that is not a valid domain event (a sign of a tampered or foreign log)."""


Validate = Callable[[Any], Any]

# topic -> (event class, its pydantic validator's validate_python). Resolving a topic imports
# and inspects a module, and reaching the validator through ``model_validate`` costs a wrapper
# per call; a rebuild decodes millions of events of a dozen classes.
_CLASSES: dict[str, tuple[type[DomainEvent], Validate]] = {}


def _event_class(topic: str) -> tuple[type[DomainEvent], Validate]:
    cls = resolve_topic(topic)
    if not (isinstance(cls, type) and issubclass(cls, DomainEvent)):
        raise TypeError(f"topic {topic!r} does not name a domain event class")
    found = _CLASSES[topic] = (cls, cls.__pydantic_validator__.validate_python)
    return found


def decode_event(originator_id: UUID | str, originator_version: int, topic: str, state: bytes) -> DomainEvent:
    """The domain event a stored row holds, upcast to its class's current version and validated
    in full (a rebuild trusts nothing it has not validated); :class:`DecodeError` if it is not one."""
    try:
        cls, validate = _CLASSES.get(topic) or _event_class(topic)
        data: dict[str, Any] = orjson.loads(state)
        from_version = data.pop("class_version", 1)
        while from_version < cls.class_version:
            getattr(cls, f"upcast_v{from_version}_v{from_version + 1}")(data)
            from_version += 1
        data["originator_id"] = originator_id
        data["originator_version"] = originator_version
        return cast(DomainEvent, validate(data))
    except (ValueError, TypeError, AttributeError, KeyError, ImportError, TopicError) as exc:
        # pydantic and orjson raise ValueErrors; the rest come from topics, states that are not
        # JSON objects and upcasters that miss a field.
        first_line = next(iter(str(exc).splitlines()), type(exc).__name__)
        raise DecodeError(f"stream {originator_id} v{originator_version} ({topic}) does not decode:"
                          f" {first_line}") from exc


MAPPER = EventMapper()
