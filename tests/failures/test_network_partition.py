"""RFC failure table, "Network partition": *renewals fail; task becomes retryable after lease
expiration.*

A real worker process reaches the Gateway only through the fault proxy
(:mod:`support.faultproxy`); a second real worker reaches it directly. The proxy cuts the first
one off for longer than its lease, two ways:

* ``PARTITION`` — what it sends waits and arrives after the partition heals (TCP kept
  retransmitting): the late renewal and the late result batch are refused with 409, recorded
  as ``WriteRejected``, and not ingested; the agent, told its lease is lost, abandons the task;
* ``BLACKHOLE`` — what it sends is lost: the agent counts its lease down on its own clock,
  stops the plugin and writes nothing more for that attempt.

Either way the sweeper expires the lease, the other worker runs the task, and it is completed
exactly once. Everything is checked in the database, plus the isolated agent's log and exit.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from support.agent import (
    AgentProcess,
    agent_process,
    attempts,
    batches,
    kill_group,
    pid_alive,
    read_pid,
    records,
    register_worker,
    rows,
    task_state,
    wait_state,
    write_plugin,
)
from support.faultproxy import Fault, fault_proxy
from support.gateway import RunningGateway
from support.waits import wait_until

LEASE_SECONDS = 3


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def gated_plugin(plugins_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Plugin ``gated``: writes its pid to ``pids/<attempt number>``, waits for the file
    ``gates/<attempt number>``, then reports its attempt number. Returns (gates, pids)."""
    gates, pids = tmp_path / "gates", tmp_path / "pids"
    gates.mkdir()
    pids.mkdir()
    write_plugin(plugins_dir, "gated", f"""
        #!/bin/sh
        echo $$ > {pids}/$LEASEHOLD_ATTEMPT_NUMBER
        while [ ! -e {gates}/$LEASEHOLD_ATTEMPT_NUMBER ]; do sleep 0.05; done
        echo '{{"type": "raw", "attempt": "'$LEASEHOLD_ATTEMPT_NUMBER'"}}'
    """)
    return gates, pids


async def task_events(gateway: RunningGateway, task_id: UUID) -> list[tuple[str, dict[str, Any]]]:
    found = await rows(gateway, "SELECT event_type, data FROM analyst_events WHERE originator_id = %s "
                                "ORDER BY originator_version", task_id)
    return [(r[0], r[1]) for r in found]


def abandoned(agent: AgentProcess, attempt_id: UUID) -> dict[str, Any] | None:
    for line in agent.log_lines():
        if line.get("msg") == "lease lost; attempt abandoned" and line.get("attempt_id") == str(attempt_id):
            return line
    return None


async def raw_output_attempts(gateway: RunningGateway, task_id: UUID) -> list[str]:
    found = await rows(gateway, "SELECT o.data ->> 'attempt' FROM raw_outputs o JOIN worker_tasks t "
                                "ON t.scan_job_id = o.scan_job_id WHERE t.id = %s", task_id)
    return [r[0] for r in found]


async def _running_attempt(gateway: RunningGateway, task_id: UUID, number: int) -> bool:
    return (await task_state(gateway, task_id))[:2] == ("running", number)


async def _attempt_count(gateway: RunningGateway, task_id: UUID, at_least: int) -> bool:
    return len(await attempts(gateway, task_id)) >= at_least


async def stop(agent: AgentProcess) -> int:
    agent.process.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(agent.process.wait(), 20)


async def test_partition_longer_than_the_lease_re_leases_the_task_and_the_late_writes_are_refused(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    gates, _ = gated_plugin(plugins_dir, tmp_path)
    isolated = await register_worker(gateway, ("gated",))
    healthy = await register_worker(gateway, ("gated",))
    task_id = await gateway.task(task_type="gated", lease_seconds=LEASE_SECONDS, max_attempts=3)

    async with fault_proxy(_port(gateway.worker_url)) as proxy:
        # Requests may wait out the whole partition: the answers come after it heals.
        argv = isolated.argv(gateway, gateway=proxy.url(), plugins_dir=plugins_dir, max_concurrency=1,
                             request_timeout_seconds=60)
        async with agent_process(argv, tmp_path / "isolated.log") as cut_off:
            await wait_state(gateway, task_id, "running")
            [first] = await attempts(gateway, task_id)
            assert first["worker_id"] == isolated.client.id
            proxy.mode = Fault.PARTITION
            (gates / "1").touch()  # the plugin finishes now: its final batch is sent into the partition

            async with agent_process(healthy.argv(gateway, plugins_dir=plugins_dir), tmp_path / "healthy.log"):
                # The lease expires, the healthy worker runs attempt 2 (which waits for its gate).
                await wait_until(lambda: _running_attempt(gateway, task_id, 2), timeout=30,
                                 what="attempt 2 running on the healthy worker")
                # Still partitioned: nothing the isolated worker sent has arrived yet.
                assert [kind for kind, _ in await task_events(gateway, task_id)].count("WriteRejected") == 0
                proxy.mode = Fault.PASS  # heal while attempt 2 holds the lease: the dangerous moment

                async def refused() -> list[dict[str, Any]] | None:
                    found = [data for kind, data in await task_events(gateway, task_id)
                             if kind == "WriteRejected" and data["command"] == "results"]
                    return found or None

                [late_batch] = await wait_until(refused, timeout=20, what="the late result batch to arrive")
                line = await wait_until(lambda: abandoned(cut_off, first["id"]),
                                        timeout=20, what="the isolated agent to abandon the attempt")
                # The live attempt was not disturbed: still running, nothing accepted for it yet.
                assert (await task_state(gateway, task_id))[:2] == ("running", 2)
                assert await batches(gateway, task_id) == []
                (gates / "2").touch()
                await wait_state(gateway, task_id, "completed", within=20)
            assert await stop(cut_off) == 0, cut_off.log_text()

    first, second = await attempts(gateway, task_id)
    assert (first["status"], first["worker_id"]) == ("expired", isolated.client.id)
    assert (second["status"], second["worker_id"]) == ("succeeded", healthy.client.id)
    assert (await task_state(gateway, task_id))[:2] == ("completed", 2)
    assert (late_batch["attempt_id"], late_batch["reason"]) == (str(first["id"]), "superseded")
    assert "superseded" in line["reason"], line  # the Gateway's 409 answer, as the agent logged it
    events = await task_events(gateway, task_id)
    kinds = [kind for kind, _ in events]
    assert kinds.count("LeaseExpired") == 1 and kinds.count("TaskCompleted") == 1
    assert {data["attempt_id"] for kind, data in events if kind == "WriteRejected"} == {str(first["id"])}
    [batch] = await batches(gateway, task_id)  # only the new attempt's result was accepted ...
    assert batch["attempt_id"] == second["id"]
    assert await records(gateway, task_id) == [{"type": "raw", "attempt": "2"}]
    assert await raw_output_attempts(gateway, task_id) == ["2"]  # ... and ingested
    assert "lease_token" not in cut_off.log_text()


async def test_blackholed_worker_gives_up_its_lease_stops_its_plugin_and_writes_nothing_more(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    gates, pids = gated_plugin(plugins_dir, tmp_path)
    isolated = await register_worker(gateway, ("gated",))
    healthy = await register_worker(gateway, ("gated",))
    task_id = await gateway.task(task_type="gated", lease_seconds=LEASE_SECONDS, max_attempts=3)

    async with fault_proxy(_port(gateway.worker_url)) as proxy:
        argv = isolated.argv(gateway, gateway=proxy.url(), plugins_dir=plugins_dir, max_concurrency=1,
                             request_timeout_seconds=1)
        async with agent_process(argv, tmp_path / "isolated.log") as cut_off:
            await wait_state(gateway, task_id, "running")
            [first] = await attempts(gateway, task_id)
            assert first["worker_id"] == isolated.client.id
            plugin_pid = await read_pid(pids / "1")
            try:
                proxy.mode = Fault.BLACKHOLE
                healthy_agent = agent_process(healthy.argv(gateway, plugins_dir=plugins_dir),
                                              tmp_path / "healthy.log")
                async with healthy_agent as other:
                    # Cut off, the agent stops its plugin once its lease must have run out ...
                    await wait_until(lambda: not pid_alive(plugin_pid), timeout=LEASE_SECONDS + 10,
                                     what="the isolated agent to stop its plugin")
                    line = await wait_until(lambda: abandoned(cut_off, first["id"]),
                                            what="the isolated agent to abandon the attempt")
                    # ... and the Gateway, on its side, expires the lease and re-leases the task.
                    await wait_until(lambda: _attempt_count(gateway, task_id, 2), timeout=20,
                                     what="a second attempt")
                    (gates / "2").touch()
                    await wait_state(gateway, task_id, "completed", within=20)
                    assert await stop(other) == 0
            finally:
                kill_group(plugin_pid)
            proxy.mode = Fault.PASS
            # Healed: the isolated worker takes the next task, so it talks to the Gateway again ...
            scan = await gateway.scans.create_scan(gateway.org, {"targets": ["127.0.0.1"]})
            (gates / "1").touch()  # its first attempt runs straight through
            later = await gateway.task(task_type="gated", scan=scan)
            await wait_state(gateway, later, "completed", within=30)
            assert [a["worker_id"] for a in await attempts(gateway, later)] == [isolated.client.id]
            assert await stop(cut_off) == 0, cut_off.log_text()

    # ... and it sent nothing more for the attempt it gave up.
    first, second = await attempts(gateway, task_id)
    assert (first["status"], second["status"], second["worker_id"]) == ("expired", "succeeded", healthy.client.id)
    assert "unreachable" in line["reason"], line
    events = await task_events(gateway, task_id)
    kinds = [kind for kind, _ in events]
    assert kinds.count("LeaseExpired") == 1 and kinds.count("TaskCompleted") == 1
    assert "WriteRejected" not in kinds
    # In order (renewals and batches left out): the disconnected worker was never told anything;
    # its lease ran out on the Gateway's side and the task went on elsewhere.
    assert [kind for kind in kinds if kind not in ("LeaseRenewed", "ResultBatchAccepted")] == [
        "TaskCreated", "TaskLeased", "TaskStarted", "LeaseExpired", "TaskLeased", "TaskStarted", "TaskCompleted"]
    [batch] = await batches(gateway, task_id)
    assert batch["attempt_id"] == second["id"]
    assert await raw_output_attempts(gateway, task_id) == ["2"]


async def test_a_request_cut_off_mid_body_is_no_server_error(
        gateway: RunningGateway, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A worker whose connection drops while it sends a body (it gave up, the network took it):
    the Gateway has nobody to answer, and nothing of its own went wrong — no 500, no traceback."""
    caplog.set_level(logging.INFO, logger="leasehold.gateway")
    worker = await register_worker(gateway, ("gated",))
    _, writer = await asyncio.open_connection(
        "127.0.0.1", _port(gateway.worker_url), ssl=gateway.worker_ssl(worker.cert, worker.key),
        server_hostname="localhost")
    writer.write(b"POST /v1/tasks/acquire HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"wait_seconds\": ")
    await writer.drain()
    writer.transport.abort()  # gone, 83 bytes short

    def noted() -> bool:
        return any("went away" in r.getMessage() for r in caplog.records)

    await wait_until(lambda: noted(), what="the Gateway to notice the lost request")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("leasehold")]
    assert errors == [], [r.getMessage() for r in errors]
