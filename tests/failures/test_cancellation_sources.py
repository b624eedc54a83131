"""RFC "Cancellation", source by source, end to end: a real Gateway (real TLS, real PostgreSQL;
in the test's process, or ``leasehold gateway serve`` where it must stop) and real ``leasehold
worker run`` processes running real plugin processes. Each test asserts the task's events in
order (renewals and result batches left out: how many there are depends on timing) and that
the plugin was stopped.

Here: the user cancels a scan (delivered on a renewal), an administrator removes an assignment
(delivered on a long-poll), an administrator disables the worker, the execution deadline
expires, and the Gateway shuts down. The other two sources, also with real agent processes and
events in order: the worker disconnects (``test_network_partition.py``) and the worker crashes
(``test_worker_crash.py``).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from leasehold.cli.dev_ca import issue_worker_certificate
from leasehold.gateway.commands.lifecycle import TaskSpec
from leasehold.gateway.services import build_services
from leasehold.gateway.tls import PkiPaths
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database
from leasehold.replay.asof import task_as_of
from leasehold.replay.timeline import task_timeline
from support.agent import (
    AgentProcess,
    agent_process,
    attempts,
    kill_group,
    pid_alive,
    read_pid,
    register_worker,
    rows,
    sleepy_plugin,
    task_state,
    wait_state,
    write_plugin,
)
from support.gateway import GatewayProcess, RunningGateway, service_get
from support.waits import wait_until

#: Events whose number depends on timing, not on what happened.
_CHATTER = frozenset({"LeaseRenewed", "ResultBatchAccepted", "LeaseReissued"})


async def lifecycle_events(gateway: RunningGateway, task_id: UUID) -> list[tuple[str, dict[str, Any]]]:
    """(event type, data) of the task's stream in order, without renewals and result batches;
    ``data`` also carries the event's time under ``at``."""
    found = await rows(gateway, "SELECT event_type, data, occurred_at FROM analyst_events "
                                "WHERE originator_id = %s ORDER BY originator_version", task_id)
    return [(kind, {**data, "at": at}) for kind, data, at in found if kind not in _CHATTER]




async def plugin_stopped(pid: int, within: float) -> float:
    """Seconds until process ``pid`` is gone (fails after ``within``)."""
    started = time.monotonic()
    await wait_until(lambda: not pid_alive(pid), timeout=within, interval=0.02,
                     what=f"plugin {pid} to be stopped")
    return time.monotonic() - started


async def leg_counts(gateway: RunningGateway) -> dict[tuple[str, str], float]:
    """``leasehold_cancellation_leg_seconds_count`` samples by (leg, channel)."""
    reply = await service_get(gateway.pki, gateway.operator_url + "/metrics")
    out: dict[tuple[str, str], float] = {}
    for line in str(reply.body).splitlines():
        if line.startswith("leasehold_cancellation_leg_seconds_count{"):
            labels = dict(part.split("=") for part in line[line.index("{") + 1:line.index("}")].split(","))
            out[(labels["leg"].strip('"'), labels["channel"].strip('"'))] = float(line.split()[-1])
    return out


async def assert_cancellation_on_record(gateway: RunningGateway, task_id: UUID, channel: str) -> None:
    """Request -> delivery (``channel``) -> acknowledgement, in order with times, in the events,
    the timeline, ``as-of``, both analyst views and the metric."""
    events = await lifecycle_events(gateway, task_id)
    assert [kind for kind, _ in events] == [
        "TaskCreated", "TaskLeased", "TaskStarted", "CancelRequested", "CancelDelivered", "TaskCancelled"], events
    (_, leased), (_, requested), (_, delivered), (_, cancelled) = events[1], events[3], events[4], events[5]
    assert (delivered["attempt_id"], delivered["channel"]) == (leased["attempt_id"], channel)
    assert cancelled["reason"] == "acknowledged by worker" and cancelled["attempt_id"] == leased["attempt_id"]
    requested_at, delivered_at, acked_at = requested["at"], delivered["at"], cancelled["at"]
    assert requested_at <= delivered_at <= acked_at

    async with gateway.pool.connection() as conn:
        timeline = await task_timeline(conn, task_id)
        as_of_delivery = await task_as_of(conn, task_id, delivered_at)
    steps = [(e.event_type, e.time) for e in timeline if e.event_type in
             ("CancelRequested", "CancelDelivered", "TaskCancelled")]
    assert steps == [("CancelRequested", requested_at), ("CancelDelivered", delivered_at),
                     ("TaskCancelled", acked_at)]
    [delivery] = [e for e in timeline if e.event_type == "CancelDelivered"]
    assert f"on {channel}" in delivery.summary and "after the request" in delivery.summary
    assert delivery.as_json()["data"]["channel"] == channel
    [ack] = [e for e in timeline if e.event_type == "TaskCancelled"]
    assert "acknowledged by worker" in ack.summary and "after the delivery" in ack.summary
    assert as_of_delivery.task is not None and as_of_delivery.task.state == "cancelling"
    assert (as_of_delivery.task.cancel_delivered_at, as_of_delivery.task.cancel_delivery_channel) == (
        delivered_at, channel)

    task = await gateway.operator("GET", f"/v1/tasks/{task_id}")
    assert (task.body["cancel_delivery_channel"], task.body["state"]) == (channel, "cancelled"), task.body
    assert datetime.fromisoformat(task.body["cancel_delivered_at"]) == delivered_at
    page = await gateway.operator("GET", f"/v1/tasks/{task_id}/events")
    assert [(e["type"], e["payload"].get("channel")) for e in page.body["items"]
            if e["type"] in ("CancelRequested", "CancelDelivered", "TaskCancelled")] == [
        ("CancelRequested", None), ("CancelDelivered", channel), ("TaskCancelled", None)]

    [row] = await rows(gateway, """
        SELECT delivery_channel, ended_by, cancel_requested_at, cancel_delivered_at, cancel_acknowledged_at,
               request_to_delivery_seconds, delivery_to_ack_seconds
        FROM cancellation_deliveries WHERE task_id = %s""", task_id)
    to_delivery = (delivered_at - requested_at).total_seconds()
    to_ack = (acked_at - delivered_at).total_seconds()
    assert row == (channel, "acknowledged", requested_at, delivered_at, acked_at, to_delivery, to_ack)
    [by_org] = await rows(gateway, """
        SELECT cancellations, delivered, delivered_on_renew, delivered_on_long_poll, acknowledged, terminated,
               request_to_delivery_mean_seconds, request_to_delivery_max_seconds,
               delivery_to_ack_mean_seconds, delivery_to_ack_max_seconds
        FROM cancellation_latency_by_organization WHERE organization_id = %s""", gateway.org)
    on_renew = int(channel == "renew")
    assert by_org == (1, 1, on_renew, 1 - on_renew, 1, 0, to_delivery, to_delivery, to_ack, to_ack)
    counts = await leg_counts(gateway)
    assert counts[("request_to_delivery", channel)] == 1 and counts[("delivery_to_ack", channel)] == 1


# --- the user cancels the scan: delivered on a renewal ---------------------------------------


async def test_scan_cancel_reaches_a_busy_worker_on_its_renewal_and_the_record_shows_each_step(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    pid_file, _ = sleepy_plugin(plugins_dir, tmp_path)
    worker = await register_worker(gateway, ("sleepy",))
    task_id = await gateway.task(task_type="sleepy", lease_seconds=3)  # renewed every second
    # One slot, taken: the agent does not long-poll, so only a renewal can tell it.
    argv = worker.argv(gateway, plugins_dir=plugins_dir, max_concurrency=1)
    async with agent_process(argv, tmp_path / "agent.log") as agent:
        pid = await read_pid(pid_file)
        try:
            await wait_state(gateway, task_id, "running")
            reply = await gateway.operator("POST", f"/v1/scans/{gateway.scan}/cancel",
                                           {"reason": "the user cancelled the scan"})
            assert reply.status == 200, reply.body
            assert await plugin_stopped(pid, within=1 + 1 + 2) < 4  # one renew interval + kill grace
            await wait_state(gateway, task_id, "cancelled")
        finally:
            kill_group(pid)
        assert agent.process.returncode is None, agent.log_text()
    await assert_cancellation_on_record(gateway, task_id, "renew")
    [(scan_status,)] = await rows(gateway, "SELECT status FROM scans WHERE id = %s", gateway.scan)
    assert scan_status == "cancelled"


# --- an administrator removes the assignment: delivered on a long-poll ------------------------


async def test_assignment_removal_reaches_a_long_polling_worker_and_the_record_shows_each_step(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    pid_file, _ = sleepy_plugin(plugins_dir, tmp_path)
    worker = await register_worker(gateway, ("sleepy",))
    task_id = await gateway.task(task_type="sleepy", lease_seconds=60)  # next renewal in 20 s
    # A free slot: the agent keeps a long-poll open, which the cancel wakes at once.
    argv = worker.argv(gateway, plugins_dir=plugins_dir, max_concurrency=2)
    async with agent_process(argv, tmp_path / "agent.log") as agent:
        pid = await read_pid(pid_file)
        try:
            await wait_state(gateway, task_id, "running")
            removed = await gateway.operator(
                "DELETE", f"/v1/workers/{worker.client.id}/assignments/{gateway.org}")
            assert removed.status == 200 and removed.body["cancelled_task_ids"] == [str(task_id)], removed.body
            assert await plugin_stopped(pid, within=1 + 3) < 4  # well before any renewal
            await wait_state(gateway, task_id, "cancelled")
        finally:
            kill_group(pid)
        assert agent.process.returncode is None, agent.log_text()
    await assert_cancellation_on_record(gateway, task_id, "long-poll")


# --- an administrator disables the worker ------------------------------------------------------


async def test_disabling_a_worker_ends_its_attempt_at_once_its_agent_stops_the_plugin_and_another_worker_completes(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    pid_file, _ = sleepy_plugin(plugins_dir, tmp_path)
    disabled = await register_worker(gateway, ("sleepy",))
    other = await register_worker(gateway, ("sleepy",))
    lease_seconds = 3
    renew_interval = lease_seconds / 3
    task_id = await gateway.task(task_type="sleepy", lease_seconds=lease_seconds, max_attempts=3)
    argv = disabled.argv(gateway, plugins_dir=plugins_dir, max_concurrency=1)
    async with agent_process(argv, tmp_path / "disabled.log") as agent:
        pid = await read_pid(pid_file)
        try:
            await wait_state(gateway, task_id, "running")
            reply = await gateway.operator("POST", f"/v1/workers/{disabled.client.id}/disable")
            assert reply.status == 200 and reply.body["enabled"] is False, reply.body
            # Ended on the record before the answer: no waiting for the lease to lapse.
            [first] = await attempts(gateway, task_id)
            assert first["status"] == "cancelled" and first["error"] == "worker disabled"
            assert (await task_state(gateway, task_id))[:2] == ("retry_wait", 1)
            # Its next renewal is refused (403): the agent stops the plugin.
            assert await plugin_stopped(pid, within=renew_interval + 1 + 2) < renew_interval + 1 + 2
        finally:
            kill_group(pid)
        assert agent.process.returncode is None, agent.log_text()

        async def abandoned() -> list[dict[str, Any]]:  # logged once the plugin has exited
            return [line for line in agent.log_lines() if line.get("msg") == "lease lost; attempt abandoned"]

        lost = await wait_until(abandoned, timeout=5, what="the agent to log the abandoned attempt")
        assert [line["attempt_id"] for line in lost] == [str(first["id"])]
        assert "disabled" in lost[0]["reason"], lost

        async with agent_process(other.argv(gateway, plugins_dir=plugins_dir), tmp_path / "other.log"):
            await wait_state(gateway, task_id, "completed", within=20)

        events = await lifecycle_events(gateway, task_id)
        assert [kind for kind, _ in events] == [
            "TaskCreated", "TaskLeased", "TaskStarted", "AttemptRevoked", "TaskLeased", "TaskStarted",
            "TaskCompleted"], events
        revoked, second_lease = events[3][1], events[4][1]
        assert (revoked["attempt_id"], revoked["outcome"], revoked["reason"]) == (
            str(first["id"]), "retry_wait", "worker disabled")
        assert revoked["available_at"] is not None and second_lease["worker_id"] == str(other.client.id)
        assert events[6][1]["attempt_id"] == second_lease["attempt_id"]

        # Enabled again, the same running agent gets new work only: nothing of the old attempt.
        enabled = await gateway.operator("POST", f"/v1/workers/{disabled.client.id}/enable")
        assert enabled.status == 200 and enabled.body["enabled"] is True
        scan = await gateway.scans.create_scan(gateway.org, {"targets": ["127.0.0.1"]})
        later = await gateway.task(task_type="sleepy", lease_seconds=lease_seconds, scan=scan)
        await wait_state(gateway, later, "completed", within=20)
        assert [a["worker_id"] for a in await attempts(gateway, later)] == [disabled.client.id]
        assert [kind for kind, _ in await lifecycle_events(gateway, task_id)][-1] == "TaskCompleted"
        [(rejected,)] = await rows(gateway, "SELECT count(*) FROM analyst_events WHERE originator_id = %s "
                                            "AND event_type = 'WriteRejected'", task_id)
        assert rejected == 0  # the disabled worker's writes were refused before touching the task


# --- the execution deadline expires ------------------------------------------------------------


async def test_the_execution_deadline_stops_the_plugin_and_times_the_attempt_out_on_the_record(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "hang.pid"
    write_plugin(plugins_dir, "hang", f"""
        #!/bin/sh
        echo $$ > {pid_file}
        exec sleep 60
    """)
    worker = await register_worker(gateway, ("hang",))
    task_id = await gateway.task(task_type="hang", lease_seconds=2, execution_timeout_seconds=2, max_attempts=1)
    async with agent_process(worker.argv(gateway, plugins_dir=plugins_dir), tmp_path / "agent.log") as agent:
        pid = await read_pid(pid_file)
        try:
            assert await plugin_stopped(pid, within=2 + 1 + 3) < 6
            await wait_state(gateway, task_id, "failed_terminal")
        finally:
            kill_group(pid)
        assert agent.process.returncode is None, agent.log_text()
    events = await lifecycle_events(gateway, task_id)
    assert [kind for kind, _ in events] == ["TaskCreated", "TaskLeased", "TaskStarted", "AttemptTimedOut"], events
    timed_out = events[3][1]
    # The agent's watchdog stops the plugin at the deadline and writes nothing more; the sweeper
    # records the timeout (a policy limit, not a failure of the worker, and never retried).
    assert timed_out["deadline_at"] is not None, timed_out


# --- the Gateway shuts down --------------------------------------------------------------------


async def test_a_gateway_shut_down_under_a_running_task_never_cancels_it_the_lease_lapses_and_it_runs_again(
        database_url: str, pki: PkiPaths, plugins_dir: Path, tmp_path: Path) -> None:
    """Nobody can tell the worker anything: it gives the lease up on its own clock and stops the
    plugin; the Gateway, back, expires the lease and the task runs again."""
    pid_file, _ = sleepy_plugin(plugins_dir, tmp_path)
    server = GatewayProcess(database_url, pki, tmp_path / "gateway.log", options={"poll_interval_seconds": 1})
    pool = create_pool(database_url, min_size=1, max_size=4)
    await pool.open()
    try:
        services = build_services(Database(pool))
        org = await services.registry.create_organization(f"org-{uuid4().hex[:8]}")
        scan = await services.scans.create_scan(org, {"targets": ["192.0.2.10"]})
        task_id = (await services.lifecycle.create_task(scan, TaskSpec(task_type="sleepy", lease_seconds=2))).id
        cert = issue_worker_certificate(pki.directory, "shutdown-worker")
        worker_id = await services.registry.register_worker(name="shutdown-worker", fingerprint=cert.fingerprint,
                                                            task_types=("sleepy",), max_concurrent_tasks=1)
        await services.registry.assign_worker(worker_id, org)
        argv = ["--gateway", server.worker_url, "--cert", str(cert.cert_path), "--key", str(cert.key_path),
                "--ca", str(pki.ca_cert), "--log-format", "json", "--plugins-dir", str(plugins_dir),
                "--max-concurrency", "1", "--wait-seconds", "5", "--batch-seconds", "0.2",
                "--kill-grace-seconds", "1", "--request-timeout-seconds", "1",
                "--backoff-initial-seconds", "0.05", "--backoff-max-seconds", "0.5"]

        async def state() -> str:
            async with pool.connection() as conn:
                cur = await conn.execute("SELECT state FROM worker_tasks WHERE id = %s", (task_id,))
                row = await cur.fetchone()
            assert row is not None
            return str(row[0])

        await server.start()
        try:
            async with agent_process(argv, tmp_path / "agent.log") as agent:
                pid = await read_pid(pid_file)
                try:
                    await wait_until(lambda: _is(state, "running"), what="the task to run")
                    assert await server.stop() == 0  # SIGTERM: a graceful shutdown
                    await plugin_stopped(pid, within=2 + 1 + 3)  # the lease's length, the kill grace
                finally:
                    kill_group(pid)
                await wait_until(lambda: _abandoned(agent), timeout=5,
                                 what="the agent to log the abandoned attempt")
                await server.start()
                await wait_until(lambda: _is(state, "completed"), timeout=30, what="the task to complete")
        finally:
            await server.stop()
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT event_type, data ->> 'outcome' FROM analyst_events "
                                     "WHERE originator_id = %s ORDER BY originator_version", (task_id,))
            events = [(kind, outcome) for kind, outcome in await cur.fetchall() if kind not in _CHATTER]
    finally:
        await pool.close()
    # A renewal the agent still retried while the Gateway was down may reach the new Gateway after
    # the lease lapsed: refused, and recorded as a WriteRejected. It changes nothing.
    rejected = [kind for kind, _ in events if kind == "WriteRejected"]
    events = [(kind, outcome) for kind, outcome in events if kind != "WriteRejected"]
    assert len(rejected) <= 1
    assert [kind for kind, _ in events] == [
        "TaskCreated", "TaskLeased", "TaskStarted", "LeaseExpired", "TaskLeased", "TaskStarted", "TaskCompleted"]
    assert events[3] == ("LeaseExpired", "retry_wait")


async def _is(state: Any, wanted: str) -> bool:
    return bool(await state() == wanted)


def _abandoned(agent: AgentProcess) -> bool:
    return any(line.get("msg") == "lease lost; attempt abandoned" for line in agent.log_lines())
