"""Schemathesis hooks for the fuzz runs of ``test_schemathesis`` (loaded with
``SCHEMATHESIS_HOOKS=schemathesis_hooks``, this directory on ``PYTHONPATH``).

Each hook stands for a rule of the API that no JSON Schema can state, and does what a real
client does about it, so that a schema-valid request really is valid and reaches the code
behind the validation. Requests the hooks leave alone are sent exactly as generated.

* A result batch carries the sha256 of its own canonical payload: computed here, for every batch
  whose generated digest is well-formed (malformed digests are still sent, and must be refused).
* An administrator key names the organisation it acts for when it creates a scan, a schedule or
  a profile (an organisation key acts for its own): when ``LEASEHOLD_FUZZ_ORGANIZATION`` is set
  (the administrator's run), a body without ``organization_id`` gets that organisation.
"""

from __future__ import annotations

import os
import re
from typing import Any

import schemathesis
from schemathesis.core import NotSet

from leasehold.domain.results import payload_sha256

HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
ACTS_FOR_AN_ORGANISATION = {"/v1/scans", "/v1/schedules", "/v1/profiles"}


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    body, path = case.body, case.operation.path
    if isinstance(body, NotSet) and case.operation.method.upper() == "POST" and path in ACTS_FOR_AN_ORGANISATION:
        body = {}  # no body reads as {}
    if not isinstance(body, dict):
        return case
    if (path.endswith("/results") and isinstance(body.get("payload_sha256"), str)
            and HEX64.match(body["payload_sha256"])
            and isinstance(body.get("payload"), list) and all(isinstance(r, dict) for r in body["payload"])):
        try:
            case.body = {**body, "payload_sha256": payload_sha256(body["payload"])}
        except TypeError:  # no canonical form (an integer beyond 64 bits): sent as generated
            pass
    organization = os.environ.get("LEASEHOLD_FUZZ_ORGANIZATION")
    if (organization and case.operation.method.upper() == "POST" and path in ACTS_FOR_AN_ORGANISATION
            and body.get("organization_id") is None and body.get("scope") != "global"):
        case.body = {**body, "organization_id": organization}
    return case
