"""The Gateway's log lines: UTC ISO 8601 with milliseconds, pid, the request id on every line of a
request, the operator key id once the key is known; the worker's JSON formatter, the same one."""

from __future__ import annotations

import io
import logging
import os
import re

import orjson

from leasehold.gateway.logs import JsonFormatter as GatewayJsonFormatter
from leasehold.protocol.logs import JsonFormatter
from support.gateway import RunningGateway

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


async def test_request_lines_carry_time_pid_request_id_and_operator_key(gateway: RunningGateway) -> None:
    assert GatewayJsonFormatter is JsonFormatter
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("leasehold.gateway")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        reply = await gateway.operator("GET", "/v1/organizations")
        worker = await gateway.worker()
        await worker.acquire()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    requests = {line["route"]: line for line in lines if line["msg"] == "request"}
    operator_line, worker_line = requests["/v1/organizations"], requests["/v1/tasks/acquire"]
    keys = await gateway.count("SELECT id::text FROM api_keys WHERE name = 'bootstrap administrator'")
    for line in (operator_line, worker_line):
        assert TIMESTAMP.match(line["ts"]), line["ts"]
        assert line["pid"] == os.getpid()
    assert operator_line["request_id"] == {k.lower(): v for k, v in reply.headers.items()}["x-request-id"], reply.headers
    assert operator_line["operator_key_id"] == keys
    assert worker_line["operator_key_id"] is None and worker_line["worker"] == worker.fingerprint
