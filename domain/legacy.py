"""Legacy queue messages: what the Redis list of the legacy scan path carries, and how it is read.

The legacy API enqueued one message per scan (``LPUSH``; the legacy worker took them with
``BRPOP``). ``leasehold legacy drain`` reads the same messages; this module says what a valid
one is. A message is one JSON object:

.. code-block:: json

    {"scan_id": "7d9f0c52-…", "organization_id": "3b1e…",
     "targets": ["10.0.0.5", "example.com"],
     "profile": "default"}

* ``scan_id`` — the scan's id in the legacy system: a string of 1..200 characters, or an
  integer. The Gateway scan made from the message is keyed on it (unique among Gateway scans).
* ``organization_id`` — the organisation (a UUID known to leasehold).
* ``targets`` — the scan's targets: an object, stored as the scan's targets (e.g.
  ``{"targets": [...], "ports": [443]}``), or a list of strings, short for ``{"targets": [...]}``.
* exactly one of ``profile`` — the name of a stored profile of the organisation (or a global
  one) — and ``steps`` — the plugins in order, each a task type (``"tcp-connect"``) or a step
  object with the fields of a profile step (``{"task_type": "http-probe", "max_attempts": 2}``).

Other fields are ignored (legacy producers add their own). The message's identity is the sha256
of its canonical JSON (keys sorted, no spaces), so the same message re-sent is recognised
whatever its formatting.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated, Any
from uuid import UUID

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from leasehold.domain.errors import InvalidRequest, LeaseholdError
from leasehold.domain.events import ProfileStep
from leasehold.domain.limits import check_body, check_field
from leasehold.domain.scan import MAX_LEGACY_SCAN_ID, validate_steps

MAX_MESSAGE_BYTES = 1 << 20


class InvalidMessage(InvalidRequest):
    """The legacy message is not one the drain can convert."""

    code = "invalid-legacy-message"


@dataclass(frozen=True, slots=True)
class LegacyMessage:
    legacy_scan_id: str
    organization_id: UUID
    targets: dict[str, Any]
    profile_name: str | None
    steps: tuple[ProfileStep, ...]
    sha256: str


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    scan_id: Annotated[StrictStr, Field(min_length=1, max_length=MAX_LEGACY_SCAN_ID)] | StrictInt
    organization_id: UUID
    targets: dict[str, Any] | list[StrictStr]
    profile: Annotated[StrictStr, Field(min_length=1, max_length=100)] | None = None
    steps: list[StrictStr | ProfileStep] | None = None


def _reason(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "message"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def parse_message(raw: bytes) -> LegacyMessage:
    """The message, or :class:`InvalidMessage` saying what is wrong with it."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise InvalidMessage(f"the message has {len(raw)} bytes, more than {MAX_MESSAGE_BYTES}")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidMessage(f"a message is a JSON object, not {type(data).__name__}")
    try:
        check_body(data)
        check_field("targets", data.get("targets"))
    except LeaseholdError as exc:
        raise InvalidMessage(exc.message) from exc
    try:
        body = _Body.model_validate(data)
    except ValidationError as exc:
        raise InvalidMessage(_reason(exc)) from exc
    if (body.profile is None) == (body.steps is None):
        raise InvalidMessage("give exactly one of profile (a stored profile's name) and steps")
    steps = tuple(ProfileStep(task_type=s) if isinstance(s, str) else s for s in body.steps or ())
    if body.steps is not None:
        try:
            validate_steps(steps)
        except InvalidRequest as exc:
            raise InvalidMessage(f"steps: {exc.message}") from exc
    targets = body.targets if isinstance(body.targets, dict) else {"targets": list(body.targets)}
    sha256 = hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return LegacyMessage(legacy_scan_id=str(body.scan_id), organization_id=body.organization_id,
                         targets=targets, profile_name=body.profile, steps=steps, sha256=sha256)
