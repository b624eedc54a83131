"""Stored event -> domain event, as :data:`persistence.codec.MAPPER` does it, about twice as fast.

Same steps as ``EventMapper.to_domain_event``: resolve the topic to the event class, decode the
orjson state, run the class's ``upcast_vN_vN+1`` functions, add the stream position, and
validate with the class's own pydantic validator. The speed comes only from caching the class
and its validator per topic and skipping the generic wrappers, never from skipping validation:
a rebuild trusts nothing it has not validated. ``tests/replay`` checks that both decoders give
equal events on a whole randomised log.
"""

from __future__ import annotations

from typing import Any, cast
from uuid import UUID

import orjson
from eventsourcing.utils import resolve_topic

from domain.events import DomainEvent


class DecodeError(ValueError):
    """A stored event that is not a valid domain event (a sign of a tampered or foreign log)."""


class Decoder:
    """Callable ``(originator_id, originator_version, topic, state) -> DomainEvent``."""

    def __init__(self) -> None:
        self._classes: dict[str, tuple[type[DomainEvent], Any]] = {}

    def _resolve(self, topic: str) -> tuple[type[DomainEvent], Any]:
        found = self._classes.get(topic)
        if found is None:
            cls = cast(type[DomainEvent], resolve_topic(topic))
            if not (isinstance(cls, type) and issubclass(cls, DomainEvent)):
                raise TypeError(f"topic {topic!r} does not name a domain event class")
            found = self._classes[topic] = (cls, cls.__pydantic_validator__)
        return found

    def __call__(self, originator_id: UUID, originator_version: int, topic: str,
                 state: bytes) -> DomainEvent:
        try:
            cls, validator = self._resolve(topic)
            data: dict[str, Any] = orjson.loads(state)
            from_version = data.pop("class_version", 1)
            while from_version < cls.class_version:
                getattr(cls, f"upcast_v{from_version}_v{from_version + 1}")(data)
                from_version += 1
            data["originator_id"] = originator_id
            data["originator_version"] = originator_version
            return cast(DomainEvent, validator.validate_python(data))
        except (ValueError, TypeError, AttributeError, ImportError) as exc:  # pydantic, orjson, topics
            raise DecodeError(f"stream {originator_id} v{originator_version} ({topic}) does not decode:"
                              f" {str(exc).splitlines()[0]}") from exc


DECODE = Decoder()
