"""One set of wire models: the worker API's messages (protocol.wire) are the same classes on both
sides, strict for requests and lenient for answers; the operator client's own models
(client/models.py, which cannot import the server's) accept every answer the OpenAPI document
allows, so they cannot drift from the Gateway's."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import pytest
from pydantic import BaseModel, SecretStr, ValidationError

from leasehold.client import models as client_models
from leasehold.gateway.api import worker_models
from leasehold.protocol import wire
from leasehold.worker import client as worker_client

OPENAPI = orjson.loads((Path(__file__).resolve().parents[1] / "docs" / "openapi.json").read_bytes())
SCHEMAS: dict[str, Any] = OPENAPI["components"]["schemas"]
#: A client model whose Gateway component has another name.
COMPONENT = {"Assignment": "AssignmentView", "ApiKey": "ApiKeyView"}
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).isoformat()
AN_ID = "00000000-0000-0000-0000-000000000001"


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = SCHEMAS[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def instances(schema: dict[str, Any], depth: int = 0) -> list[Any]:
    """Values the schema allows, covering its corners: each branch of an ``anyOf``, each enum
    value, every property and only the required ones (not every combination: a bounded set)."""
    schema = _resolve(schema)
    if "const" in schema:
        return [schema["const"]]
    if "enum" in schema:
        return list(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return [v for branch in schema[key] for v in instances(branch, depth)]
    if "allOf" in schema:
        return instances(schema["allOf"][0], depth)
    kind = schema.get("type")
    if kind == "null":
        return [None]
    if kind == "boolean":
        return [True, False]
    if kind == "integer":
        return [max(schema.get("minimum", 0), 0)]
    if kind == "number":
        return [1.5]
    if kind == "string":
        return [{"uuid": AN_ID, "date-time": NOW}.get(schema.get("format", ""), "some text")]
    if kind == "array":
        items = schema.get("items", {})
        return [[], *([[v] for v in instances(items, depth + 1)] if depth < 6 and items else [])]
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        if depth >= 6:
            return [{name: instances(properties[name], depth + 1)[0] for name in required}]
        variants = {name: instances(p, depth + 1) for name, p in properties.items()}
        widest = max((len(v) for v in variants.values()), default=1)
        full = [{name: values[i % len(values)] for name, values in variants.items()} for i in range(widest)]
        bare = [{name: values[i % len(values)] for name, values in variants.items() if name in required}
                for i in range(widest)]
        return [*full, *bare] if properties else [{}]
    return [None, "any", 1, {"a": 1}, [1]]  # no type: any JSON


def client_models_and_components() -> list[tuple[type[BaseModel], str]]:
    found: list[tuple[type[BaseModel], str]] = []
    for _, model in inspect.getmembers(client_models, inspect.isclass):
        if issubclass(model, client_models.Answer) and model is not client_models.Answer:
            found.append((model, COMPONENT.get(model.__name__, model.__name__)))
    return found


@pytest.mark.parametrize(("model", "component"), client_models_and_components(),
                         ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_the_operator_clients_models_accept_every_answer_the_document_allows(
        model: type[BaseModel], component: str) -> None:
    assert component in SCHEMAS, f"no answer schema {component} for the client's {model.__name__}"
    for value in instances(SCHEMAS[component]):
        try:
            model.model_validate(value)
        except ValidationError as exc:
            raise AssertionError(f"{model.__name__} refuses an answer {component} allows: {value}\n{exc}") from None


def test_every_answer_of_the_operator_client_is_an_answer_of_the_document() -> None:
    """The client names a schema for each of its models; their fields are the document's."""
    for model, component in client_models_and_components():
        properties = _resolve(SCHEMAS[component]).get("properties", {})
        unknown = set(model.model_fields) - set(properties)
        assert not unknown, f"{model.__name__} reads fields {component} does not have: {sorted(unknown)}"


def test_the_worker_messages_are_one_set_of_classes() -> None:
    """The Gateway's worker models are the wire's (re-exported, not copied), and the agent has no
    answer models of its own."""
    for name in worker_models.__all__:
        value = getattr(worker_models, name)
        if inspect.isclass(value):
            assert value is getattr(wire, name), name
    agent_models = [name for name, value in vars(worker_client).items()
                    if inspect.isclass(value) and issubclass(value, BaseModel) and value.__module__ == worker_client.__name__]
    assert agent_models == []


@pytest.mark.parametrize("model", [wire.AcquireRequest, wire.WorkerWriteRequest, wire.FailRequest,
                                   wire.ScopePageRequest, wire.ResultBatchRequest, wire.CompleteRequest])
def test_requests_refuse_unknown_fields(model: type[wire.Request]) -> None:
    schema = _resolve(SCHEMAS[model.__name__])
    assert schema.get("additionalProperties") is False
    with pytest.raises(ValidationError, match="extra_forbidden"):
        model.model_validate({"lease_token": "t" * 16, "page": 1, "error": "e", "sequence_number": 1,
                              "idempotency_key": "k", "payload_sha256": "0" * 64, "payload": [],
                              "from_a_newer_agent": 1})


def lease_answer() -> dict[str, Any]:
    task = {"id": AN_ID, "scan_id": AN_ID, "scan_job_id": AN_ID, "task_type": "probe", "state": "leased",
            "priority": 0, "scope": {}, "scope_ref": None, "parameters": {}, "attempt_count": 1, "max_attempts": 3,
            "lease_seconds": 60, "execution_timeout_seconds": 600, "cancel_requested": False, "last_error": None}
    attempt = {"id": AN_ID, "attempt_number": 1, "status": "leased", "leased_at": NOW, "lease_expires_at": NOW,
               "deadline_at": NOW, "started_at": None, "finished_at": None, "batch_count": 0,
               "final_batch_accepted": False, "error": None}
    return {"lease": {"task": task, "attempt": attempt, "attempt_id": AN_ID, "lease_token": "s3cret-token-0123456",
                      "lease_expires_at": NOW, "deadline_at": NOW, "target_policy": {"allow": [], "deny": []}},
            "cancel_requested": [{"task_id": AN_ID, "attempt_id": AN_ID}]}


def test_answers_from_a_newer_gateway_parse_and_its_extra_fields_are_ignored() -> None:
    newer = lease_answer()
    newer["said_later"] = 1
    newer["lease"]["task"]["said_later"] = {"a": 1}
    newer["lease"]["attempt"]["said_later"] = [1]
    newer["cancel_requested"][0]["said_later"] = None
    parsed = wire.AcquireResponse.model_validate(newer)
    assert parsed.lease is not None and parsed.lease.task.id == UUID(AN_ID)
    assert "said_later" not in parsed.model_dump()


@pytest.mark.parametrize("model", [wire.AcquireResponse, wire.RenewResponse, wire.TaskStatus, wire.BatchAck,
                                   wire.ScopePageView], ids=lambda m: m.__name__)
def test_the_agent_parses_every_answer_the_document_allows(model: type[wire.Answer]) -> None:
    for answer in instances(SCHEMAS[model.__name__]):
        model.model_validate(answer)


def test_the_lease_token_travels_as_text_and_prints_hidden() -> None:
    parsed = wire.AcquireResponse.model_validate(lease_answer())
    assert parsed.lease is not None
    assert isinstance(parsed.lease.lease_token, SecretStr)
    assert "s3cret" not in repr(parsed) and "s3cret" not in str(parsed.lease)
    assert parsed.model_dump(mode="json")["lease"]["lease_token"] == "s3cret-token-0123456"
    assert _resolve(SCHEMAS["Lease"])["properties"]["lease_token"]["type"] == "string"
