"""Result payloads hash their canonical bytes (domain/results.py), and the domain's refusals carry
their HTTP status, code and message (domain/errors.py)."""

from __future__ import annotations

import hashlib

import pytest

from leasehold.domain import errors
from leasehold.domain.results import canonical_payload, payload_sha256


def test_the_canonical_payload_sorts_keys_and_drops_spaces() -> None:
    records = [{"value": "10.0.0.1", "kind": "host", "ports": [443, 80]}]
    assert canonical_payload(records) == b'[{"kind":"host","ports":[443,80],"value":"10.0.0.1"}]'


def test_worker_and_gateway_agree_on_the_hash_whatever_the_key_order() -> None:
    one = [{"a": 1, "b": {"y": 2, "x": 1}}]
    other = [{"b": {"x": 1, "y": 2}, "a": 1}]
    assert payload_sha256(one) == payload_sha256(other) == hashlib.sha256(canonical_payload(one)).hexdigest()
    assert payload_sha256([{"a": 2}]) != payload_sha256([{"a": 1}])


@pytest.mark.parametrize(("cls", "status", "code"), [
    (errors.LeaseholdError, 400, "error"), (errors.InvalidRequest, 422, "invalid-request"),
    (errors.NotFound, 404, "not-found"), (errors.Forbidden, 403, "forbidden"), (errors.Conflict, 409, "conflict"),
    (errors.InvalidTransition, 409, "invalid-transition"), (errors.LeaseLost, 409, "lease-lost"),
    (errors.TaskWasCancelled, 409, "task-cancelled"), (errors.DeadlineExceeded, 409, "deadline-exceeded"),
    (errors.IdempotencyConflict, 409, "idempotency-conflict"),
    (errors.CapacityExhausted, 409, "capacity-exhausted"), (errors.Unavailable, 503, "unavailable"),
])
def test_each_refusal_has_its_status_code_and_default_message(cls: type[errors.LeaseholdError], status: int,
                                                              code: str) -> None:
    error = cls()
    assert (error.status, error.code) == (status, code)
    assert error.message == str(error) == (cls.__doc__ or "").strip() != ""
    assert error.details == {}


def test_a_refusal_without_a_docstring_has_an_empty_default_message() -> None:
    class Undocumented(errors.Conflict):
        pass

    error = Undocumented()
    assert (error.message, str(error)) == ("", "")


def test_a_refusal_keeps_its_own_message_and_details() -> None:
    error = errors.NotFound("no such task", task_id="t-1")
    assert (error.message, str(error), error.details) == ("no such task", "no such task", {"task_id": "t-1"})
