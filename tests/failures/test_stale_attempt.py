"""RFC failure table, "Stale attempt completes": *lease token and attempt ID validation rejects it.*

A paused worker comes back after its lease expired and another worker finished its task:

* ``test_a_sigstopped_worker_resumed_past_its_lease_is_refused``: a real ``leasehold worker
  run`` process, its plugin running, is SIGSTOPped. The sweeper expires its attempt, a second
  worker process leases the task again and completes it. Then the plugin finishes and the first
  process gets SIGCONT: what it sends for its old attempt (its overdue renewal, its results) is
  refused with 409 and recorded as ``WriteRejected``; it abandons the attempt. (A real worker
  never gets as far as ``complete``: that needs its final batch accepted first.)
* ``test_a_stale_attempts_results_and_complete_are_refused``: the paused worker is a hand-driven
  client holding its real token and attempt id, so it can send everything a stale attempt could
  (results, ``complete``, and every other write) once a real worker process has completed the
  task: each gets 409, nothing of it is stored or ingested.

Either way the task is completed exactly once, by the new attempt, and only its results exist:
all of it read from the database (attempts, task, result batches, ingested records, events).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any
from uuid import UUID

from leasehold.domain.results import payload_sha256
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
from support.gateway import RunningGateway
from support.waits import wait_until

LEASE = 2


async def task_events(gateway: RunningGateway, task_id: UUID) -> list[tuple[str, dict[str, Any]]]:
    found = await rows(gateway, "SELECT event_type, data FROM analyst_events WHERE originator_id = %s "
                                "ORDER BY originator_version", task_id)
    return [(r[0], r[1]) for r in found]


def paused_plugin(plugins_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Plugin ``paused``: reports one record naming its attempt; the first attempt then waits
    until the test lets it finish. Returns (its pid file, the file that lets it finish)."""
    pid_file, go = tmp_path / "first.pid", tmp_path / "go"
    write_plugin(plugins_dir, "paused", f"""
        #!/bin/sh
        echo '{{"type": "raw", "attempt": "'$LEASEHOLD_ATTEMPT_NUMBER'"}}'
        if [ "$LEASEHOLD_ATTEMPT_NUMBER" = "1" ]; then
            echo $$ > {pid_file}
            while [ ! -e {go} ]; do sleep 0.05; done
        fi
        exit 0
    """)
    return pid_file, go


async def logged(agent: AgentProcess, message: str) -> bool:
    return any(line.get("msg") == message for line in agent.log_lines())


async def assert_completed_once_by_the_second_attempt(gateway: RunningGateway, task_id: UUID,
                                                      stale_worker: UUID, fresh_worker: UUID) -> dict[str, Any]:
    found = await attempts(gateway, task_id)
    assert len(found) == 2, ([(a["number"], a["status"], a["error"]) for a in found],
                             [kind for kind, _ in await task_events(gateway, task_id)])
    first, second = found
    assert (first["status"], first["worker_id"]) == ("expired", stale_worker)
    assert (second["status"], second["worker_id"]) == ("succeeded", fresh_worker)
    assert (await task_state(gateway, task_id))[:2] == ("completed", 2)
    assert {b["attempt_id"] for b in await batches(gateway, task_id)} == {second["id"]}
    assert await records(gateway, task_id) == [{"type": "raw", "attempt": "2"}]
    [(ingested,)] = await rows(gateway, "SELECT count(*) FROM raw_outputs o JOIN worker_tasks t "
                                        "ON t.scan_job_id = o.scan_job_id WHERE t.id = %s", task_id)
    assert ingested == 1
    events = await task_events(gateway, task_id)
    assert [d["attempt_id"] for kind, d in events if kind == "TaskCompleted"] == [str(second["id"])]
    kinds = [kind for kind, _ in events]
    expired_at = kinds.index("LeaseExpired")
    assert events[expired_at][1]["attempt_id"] == str(first["id"])
    # Nothing of the first attempt was accepted after its lease expired.
    assert [kind for kind, d in events[expired_at + 1:] if d.get("attempt_id") == str(first["id"])
            and kind != "WriteRejected"] == []
    return {"first": first, "second": second, "events": events}


async def test_a_sigstopped_worker_resumed_past_its_lease_is_refused(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    pid_file, go = paused_plugin(plugins_dir, tmp_path)
    # One task at a time: with room for more it would long-poll while it runs, and a poll in
    # flight when it stops could be answered with the retried task (whose lease then expires too).
    paused = await register_worker(gateway, ("paused",), capacity=1)
    fresh = await register_worker(gateway, ("paused",))
    task_id = await gateway.task(task_type="paused", lease_seconds=LEASE, max_attempts=3)

    # Its records wait in the batcher until the plugin exits, so they are sent after the pause.
    argv = paused.argv(gateway, plugins_dir=plugins_dir, max_concurrency=1, batch_seconds=60, batch_records=1000)
    async with agent_process(argv, tmp_path / "paused.log") as stale:
        plugin_pid = await read_pid(pid_file)
        try:
            await wait_state(gateway, task_id, "running")
            os.kill(stale.process.pid, signal.SIGSTOP)
            try:
                async with agent_process(fresh.argv(gateway, plugins_dir=plugins_dir), tmp_path / "fresh.log"):
                    await wait_state(gateway, task_id, "completed", within=20)
                before = await task_events(gateway, task_id)
                go.touch()  # the first attempt's plugin finishes while its worker is still stopped
                await wait_until(lambda: _gone(plugin_pid), timeout=5, what="the first plugin to exit")
            finally:
                os.kill(stale.process.pid, signal.SIGCONT)
            await wait_until(lambda: logged(stale, "lease lost; attempt abandoned"), timeout=15,
                             what="the resumed worker to give its attempt up")
            assert stale.process.returncode is None  # it goes on working
        finally:
            kill_group(plugin_pid)

    checked = await assert_completed_once_by_the_second_attempt(gateway, task_id, paused.client.id,
                                                                fresh.client.id)
    first = checked["first"]
    after = checked["events"][len(before):]
    assert after, "the resumed worker sent nothing"
    # Everything after the pause is a refusal of the first attempt's writes, by its own worker.
    assert {kind for kind, _ in after} == {"WriteRejected"}, after
    assert {d["attempt_id"] for _, d in after} == {str(first["id"])}
    assert {d["reason"] for _, d in after} <= {"superseded", "lease_expired"}
    [(actors,)] = await rows(gateway, "SELECT array_agg(DISTINCT actor) FROM analyst_events "
                                      "WHERE originator_id = %s AND event_type = 'WriteRejected'", task_id)
    assert actors == [f"worker:{paused.client.fingerprint}"]


async def _gone(pid: int) -> bool:
    return not pid_alive(pid)


async def test_a_stale_attempts_results_and_complete_are_refused(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    paused_plugin(plugins_dir, tmp_path)
    paused = await register_worker(gateway, ("paused",))
    fresh = await register_worker(gateway, ("paused",))
    task_id = await gateway.task(task_type="paused", lease_seconds=LEASE, max_attempts=3)

    reply = await paused.client.acquire()
    assert reply.status == 200, reply.body
    stale = reply.body["lease"]
    assert (await paused.client.write(stale, "progress")).status == 200
    early = [{"type": "raw", "attempt": "stale", "n": 1}]
    ack = await paused.client.write(stale, "results", sequence_number=1, idempotency_key="stale-1",
                                    payload_sha256=payload_sha256(early), payload=early, final=False)
    assert ack.status == 200, ack.body  # accepted while its lease lived
    # ... and then it pauses: no renewal. The sweeper expires the lease; a real worker finishes.
    async with agent_process(fresh.argv(gateway, plugins_dir=plugins_dir), tmp_path / "fresh.log"):
        await wait_state(gateway, task_id, "completed", within=20)

    late = [{"type": "raw", "attempt": "stale", "n": 2}]
    before = len(await task_events(gateway, task_id))
    writes = [
        ("results", {"sequence_number": 2, "idempotency_key": "stale-2", "payload_sha256": payload_sha256(late),
                     "payload": late, "final": True}),
        ("complete", {}),
        ("renew", {}), ("progress", {}), ("fail", {"error": "late", "retryable": True}), ("cancel-ack", {}),
    ]
    for action, body in writes:
        reply = await paused.client.write(stale, action, **body)
        assert reply.status == 409, (action, reply.body)
        assert reply.headers["Content-Type"].startswith("application/problem+json")

    found = await attempts(gateway, task_id)
    assert len(found) == 2, ([(a["number"], a["status"], a["error"]) for a in found],
                             [kind for kind, _ in await task_events(gateway, task_id)])
    first, second = found
    assert (first["status"], second["status"]) == ("expired", "succeeded")
    assert (await task_state(gateway, task_id))[:2] == ("completed", 2)
    # The batch accepted while the lease lived stays (it is history), nothing later was taken.
    stored = await batches(gateway, task_id)
    assert [(b["attempt_id"], b["idempotency_key"]) for b in stored if b["attempt_id"] == first["id"]] \
        == [(first["id"], "stale-1")]
    assert [b["attempt_id"] for b in stored if b["final"]] == [second["id"]]
    assert {"type": "raw", "attempt": "stale", "n": 2} not in await records(gateway, task_id)
    [(ingested,)] = await rows(gateway, "SELECT count(*) FROM raw_outputs o JOIN worker_tasks t "
                                        "ON t.scan_job_id = o.scan_job_id WHERE t.id = %s", task_id)
    assert ingested == 2  # the early stale batch and the new attempt's: the late one was not ingested
    events = await task_events(gateway, task_id)
    refused = events[before:]
    assert [kind for kind, _ in refused] == ["WriteRejected"] * len(writes)
    assert {d["attempt_id"] for _, d in refused} == {str(first["id"])}
    assert [d["attempt_id"] for kind, d in events if kind == "TaskCompleted"] == [str(second["id"])]
