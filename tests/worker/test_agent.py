"""The worker agent against a real Gateway (real TLS, real PostgreSQL) with real plugin
subprocesses: the built-in scanners end to end, cancellation, failing plugins, settings."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import ssl
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from uuid import uuid4

import pytest
from aiohttp import web

from leasehold.cli.dev_ca import issue_self_signed
from leasehold.cli.main import build_parser
from leasehold.domain.results import payload_sha256
from leasehold.protocol.logs import JsonFormatter, TextFormatter
from leasehold.protocol.wire import Lease
from leasehold.worker.batcher import Batcher
from leasehold.worker.cli import add_arguments, settings_from_args
from leasehold.worker.plugin import BUILTIN_PLUGINS, InvalidOutput, PluginResolver, parse_record
from leasehold.worker.settings import WorkerSettings
from support.agent import (
    attempts,
    batches,
    kill_group,
    pid_alive,
    python_plugin,
    read_pid,
    records,
    register_worker,
    rows,
    running_agent,
    task_state,
    wait_state,
    write_plugin,
)
from support.gateway import RunningGateway
from support.waits import wait_until

PAGE = "<html><head><title>Leasehold scan target</title></head><body>hi</body></html>"


@asynccontextmanager
async def https_server(tmp_path: Path) -> AsyncIterator[int]:
    """An HTTPS server on 127.0.0.1 with a self-signed certificate; yields its port."""
    cert = issue_self_signed(tmp_path / "target", "scan-target")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert.cert_path, cert.key_path)

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html", headers={"Server": "scan-target/1.0"})

    app = web.Application()
    app.router.add_get("/", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


# --------------------------------------------------------------------------------------------
# 1. End to end with the built-in plugins
# --------------------------------------------------------------------------------------------


async def test_builtin_plugins_end_to_end_find_port_page_and_self_signed_certificate(
        gateway: RunningGateway, tmp_path: Path) -> None:
    worker = await register_worker(gateway, ("tcp-connect", "http-probe", "tls-inspect"))
    async with https_server(tmp_path) as port:
        service = f"127.0.0.1:{port}/tcp"
        known = {"targets": ["127.0.0.1"], "ports": [port], "assets": [{"kind": "service", "value": service}]}
        tcp = await gateway.task(task_type="tcp-connect", scope={"targets": ["127.0.0.1"], "ports": [port]},
                                 parameters={"timeout": 2})
        http = await gateway.task(task_type="http-probe", scope=known, parameters={"timeout": 5})
        tls = await gateway.task(task_type="tls-inspect", scope=known)

        async with running_agent(worker.settings(gateway)):
            for task_id in (tcp, http, tls):
                await wait_state(gateway, task_id, "completed", "failed_terminal", within=30)

    for task_id in (tcp, http, tls):
        assert (await task_state(gateway, task_id))[0] == "completed", await attempts(gateway, task_id)
        [attempt] = await attempts(gateway, task_id)
        assert attempt["status"] == "succeeded"
        accepted = await batches(gateway, task_id)
        assert [b["final"] for b in accepted][-1] is True
        assert [b["sequence_number"] for b in accepted] == list(range(1, len(accepted) + 1))
        assert all(b["idempotency_key"] == f"{attempt['id']}:{b['sequence_number']}" for b in accepted)

    found = await records(gateway, tcp)
    assert {"type": "asset", "kind": "service", "value": service}.items() <= found[0].items()
    assert any(r["type"] == "exposure" and r["change"] == "opened" for r in found)

    [probe] = [r for r in await records(gateway, http) if r["type"] == "asset" and r["kind"] == "url"]
    assert probe["value"] == f"https://127.0.0.1:{port}/"
    assert probe["attributes"]["status"] == 200
    assert probe["attributes"]["title"] == "Leasehold scan target"
    assert probe["attributes"]["server"] == "scan-target/1.0"

    inspected = await records(gateway, tls)
    [threat] = [r for r in inspected if r["type"] == "threat"]
    assert threat["external_id"] == "tls-self-signed"
    assert threat["asset"] == {"kind": "service", "value": service}
    [certificate] = [r for r in inspected if r["type"] == "asset" and r["kind"] == "certificate"]
    assert certificate["attributes"]["self_signed"] is True


# --------------------------------------------------------------------------------------------
# 4. Cancellation from the Gateway
# --------------------------------------------------------------------------------------------


async def test_cancel_stops_the_plugin_acknowledges_and_accepts_no_later_results(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "chatty.pid"
    # Ignores SIGTERM, so only the SIGKILL after the grace period stops it.
    python_plugin(plugins_dir, "chatty", f"""
        import json, os, signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        n = 0
        while True:
            n += 1
            print(json.dumps({{"type": "raw", "n": n}}), flush=True)
            time.sleep(0.05)  # a plugin that keeps emitting until it is killed
    """)
    worker = await register_worker(gateway, ("chatty",))
    lease_seconds, grace = 3, 1.0
    task_id = await gateway.task(task_type="chatty", lease_seconds=lease_seconds)
    async with running_agent(worker.settings(gateway, plugins_dir=plugins_dir, kill_grace_seconds=grace)):
        pid = await read_pid(pid_file)
        try:
            await wait_until(lambda: batches(gateway, task_id), what="a first accepted batch")
            cancelled_at = time.monotonic()
            await gateway.lifecycle.request_cancel(task_id, reason="operator cancelled the scan")

            async def gone() -> bool:
                return not pid_alive(pid)

            await wait_until(gone, timeout=lease_seconds / 3 + grace + 1.0, interval=0.02, what="the plugin to exit")
            stopped_after = time.monotonic() - cancelled_at
            await wait_state(gateway, task_id, "cancelled")
        finally:
            kill_group(pid)

    assert stopped_after < lease_seconds / 3 + grace + 1.0
    [attempt] = await attempts(gateway, task_id)
    assert attempt["status"] == "cancelled"
    [(requested_at, reason)] = await rows(gateway, """
        SELECT t.cancel_requested_at, convert_from(e.state, 'UTF8') FROM worker_tasks t
        JOIN events e ON e.originator_id = t.id AND e.topic LIKE '%%TaskCancelled'
        WHERE t.id = %s""", task_id)
    assert "acknowledged by worker" in reason  # the worker's cancel-ack, not the Gateway's timeout
    accepted = await batches(gateway, task_id)
    assert accepted and all(b["accepted_at"] < requested_at for b in accepted)
    assert not any(b["final"] for b in accepted)


# --------------------------------------------------------------------------------------------
# 5. Failing plugins, while a healthy task runs alongside
# --------------------------------------------------------------------------------------------


async def test_failing_plugins_fail_clearly_and_retry_per_policy_while_other_tasks_complete(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    write_plugin(plugins_dir, "hang", f"""
        #!/bin/sh
        echo $$ >> {pids}/hang
        exec sleep 60
    """)
    write_plugin(plugins_dir, "crash", """
        #!/bin/sh
        echo '{"type": "raw", "note": "found something before crashing"}'
        echo "scanning 10.0.0.1" >&2
        echo "boom: the scanner fell over" >&2
        exit 1
    """)
    write_plugin(plugins_dir, "garbage", f"""
        #!/bin/sh
        echo $$ >> {pids}/garbage
        echo '{{"type": "raw", "ok": true}}'
        echo 'this is not json'
        exec sleep 60
    """)
    write_plugin(plugins_dir, "picky", """
        #!/bin/sh
        echo "invalid input: scope.targets must not be empty" >&2
        exit 2
    """)
    write_plugin(plugins_dir, "refuser", """
        #!/bin/sh
        echo '{"type": "error", "message": "target refuses to be scanned", "retryable": false}'
    """)
    write_plugin(plugins_dir, "healthy", """
        #!/bin/sh
        sleep 0.5
        echo '{"type": "asset", "kind": "host", "value": "10.0.0.1", "attributes": {}}'
        echo '{"type": "raw", "done": true}'
    """)
    kinds = ("hang", "crash", "garbage", "picky", "refuser", "healthy")
    worker = await register_worker(gateway, kinds)
    tasks = {kind: await gateway.task(task_type=kind, max_attempts=2, execution_timeout_seconds=2 if kind == "hang"
                                      else 60, lease_seconds=30) for kind in kinds}

    async with running_agent(worker.settings(gateway, plugins_dir=plugins_dir, max_concurrency=6)):
        await wait_state(gateway, tasks["healthy"], "completed")
        healthy_done = time.monotonic()
        for kind in kinds[:-1]:
            await wait_state(gateway, tasks[kind], "failed_terminal", within=20)
        hang_done = time.monotonic()

    assert healthy_done < hang_done  # it completed while the hanging one was still running
    assert [r["type"] for r in await records(gateway, tasks["healthy"])] == ["asset", "raw"]

    expected = {  # kind: (attempts made, words every attempt's error contains)
        "crash": (2, ["plugin crash exited with code 1", "boom: the scanner fell over", "scanning 10.0.0.1"]),
        "garbage": (2, ["invalid output from plugin garbage", "stdout line 2", "not JSON", "this is not json"]),
        "picky": (1, ["exit code 2: bad input", "scope.targets must not be empty"]),
        "refuser": (1, ["reported an error: target refuses to be scanned"]),
    }
    for kind, (count, words) in expected.items():
        state, attempt_count, last_error = await task_state(gateway, tasks[kind])
        made = await attempts(gateway, tasks[kind])
        assert (state, attempt_count, len(made)) == ("failed_terminal", count, count), (kind, made)
        for attempt in made:
            assert attempt["status"] == "failed", (kind, attempt)
            for word in words:
                assert word in attempt["error"], (kind, word, attempt["error"])
        # Results a failed attempt sent before failing stay accepted, but it never sent a final batch.
        assert not any(b["final"] for b in await batches(gateway, tasks[kind]))
    # The hanging plugin was stopped at its execution deadline and nothing more written: the
    # Gateway ended the attempt as a timeout, not retried, and its job timed out.
    assert await task_state(gateway, tasks["hang"]) == ("failed_terminal", 1, "execution deadline exceeded")
    assert [a["status"] for a in await attempts(gateway, tasks["hang"])] == ["timeout"]
    assert await gateway.count("SELECT j.status FROM scan_jobs j JOIN worker_tasks t ON t.scan_job_id = j.id"
                               " WHERE t.id = %s", tasks["hang"]) == "timeout"
    for name in ("hang", "garbage"):  # stopped plugins are gone
        for pid in map(int, (pids / name).read_text().split()):
            assert not pid_alive(pid), name
            kill_group(pid)


# --------------------------------------------------------------------------------------------
# Plugin resolution, protocol parsing, settings, CLI
# --------------------------------------------------------------------------------------------


def test_plugin_resolution_prefers_plugins_dir_and_refuses_unsafe_names(tmp_path: Path) -> None:
    assert set(BUILTIN_PLUGINS) >= {"tcp-connect", "http-probe", "tls-inspect", "dns-resolve"}
    write_plugin(tmp_path, "tcp-connect", "#!/bin/sh\nexit 0\n")
    write_plugin(tmp_path, "custom", "#!/bin/sh\nexit 0\n")
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    resolver = PluginResolver(tmp_path)
    assert resolver.resolve("tcp-connect").argv == (str((tmp_path / "tcp-connect").resolve()),)
    assert resolver.resolve("http-probe").argv[1:] == ("-m", "leasehold.worker.plugins.http_probe")
    assert resolver.resolve("custom").source == "plugins-dir"
    assert "custom" in resolver.available() and "not-executable" not in resolver.available()
    for bad, message in [("../../bin/sh", "not a valid plugin name"), ("not-executable", "not executable"),
                         ("nope", "no plugin for task type 'nope'")]:
        with pytest.raises(Exception, match=message):
            resolver.resolve(bad)
    limited = PluginResolver(tmp_path, ["custom", "missing"])
    assert limited.missing() == ["missing"]
    with pytest.raises(Exception, match="does not offer task type 'http-probe'"):
        limited.resolve("http-probe")


def test_stdout_lines_must_be_objects_with_a_type() -> None:
    assert parse_record(b'{"type": "raw", "x": 1}\n', 1) == {"type": "raw", "x": 1}
    assert parse_record(b"   \n", 2) is None
    for line, reason in [(b"hello", "not JSON"), (b"[1, 2]", "not a JSON object"), (b'{"kind": "x"}', '"type"'),
                         (b'{"type": ""}', '"type"')]:
        with pytest.raises(InvalidOutput, match=reason):
            parse_record(line, 7)


def test_settings_from_flags_environment_and_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "worker.toml"
    config.write_text('gateway = "https://from-file:8443"\ncert = "c.pem"\nkey = "k.pem"\nca = "ca.pem"\n'
                      'max_concurrency = 3\nwait_seconds = 7\ncapabilities = ["tcp-connect"]\n')
    monkeypatch.setenv("LEASEHOLD_WORKER_MAX_CONCURRENCY", "5")
    monkeypatch.setenv("LEASEHOLD_WORKER_CONFIG", str(config))
    parser = build_parser()
    args = parser.parse_args(["worker", "run", "--gateway", "https://from-flag:9443/", "--capability", "http-probe",
                              "--capability", "tls-inspect", "--log-format", "json"])
    settings = settings_from_args(args)
    assert settings.gateway == "https://from-flag:9443"  # flag beats file
    assert settings.max_concurrency == 5  # environment beats file
    assert settings.wait_seconds == 7 and settings.cert == Path("c.pem")  # file beats defaults
    assert settings.capabilities == ["http-probe", "tls-inspect"]
    assert settings.log_format == "json"

    run_parser = argparse.ArgumentParser(prog="leasehold worker run")
    add_arguments(run_parser)
    help_text = run_parser.format_help()
    for name, field in WorkerSettings.model_fields.items():
        assert f"LEASEHOLD_WORKER_{name.upper()}" in help_text, name
        assert field.description and field.description.split()[0] in help_text, name

    with pytest.raises(ValueError, match="https"):
        WorkerSettings(gateway="http://plain:80", cert=Path("c"), key=Path("k"), ca=Path("a"))


async def test_cli_reports_configuration_errors_with_exit_status_2(tmp_path: Path) -> None:
    leasehold = Path(sys.executable).with_name("leasehold")
    process = await asyncio.create_subprocess_exec(
        str(leasehold), "worker", "run", "--gateway", "https://localhost:1", "--cert", str(tmp_path / "missing.pem"),
        "--key", str(tmp_path / "k.pem"), "--ca", str(tmp_path / "ca.pem"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("LEASEHOLD_WORKER_")})
    _, stderr = await process.communicate()
    assert process.returncode == 2
    assert b"--cert" in stderr and b"missing.pem" in stderr


def test_lease_tokens_never_reach_the_logs() -> None:
    lease = Lease.model_validate({
        "task": {"id": "00000000-0000-0000-0000-000000000001", "scan_id": "00000000-0000-0000-0000-000000000003",
                 "scan_job_id": "00000000-0000-0000-0000-000000000004", "task_type": "x", "state": "leased",
                 "priority": 0, "scope": {}, "parameters": {}, "attempt_count": 1, "max_attempts": 3,
                 "lease_seconds": 60, "execution_timeout_seconds": 600, "cancel_requested": False,
                 "last_error": None},
        "attempt": {"id": "00000000-0000-0000-0000-000000000002", "attempt_number": 1, "status": "leased",
                    "leased_at": "2024-01-01T00:00:00Z", "lease_expires_at": "2024-01-01T00:01:00Z",
                    "deadline_at": "2024-01-01T00:10:00Z", "started_at": None, "finished_at": None,
                    "batch_count": 0, "final_batch_accepted": False, "error": None},
        "attempt_id": "00000000-0000-0000-0000-000000000002", "lease_token": "s3cret-token-value-123456",
        "lease_expires_at": "2024-01-01T00:01:00Z", "deadline_at": "2024-01-01T00:10:00Z"})
    record = logging.LogRecord("leasehold.worker", logging.INFO, "", 0, "lease %s", (lease,), None)
    record.lease_token = "s3cret-token-value-123456"
    record.lease = lease
    for formatter in (JsonFormatter(), TextFormatter()):
        assert "s3cret" not in formatter.format(record)


async def test_batcher_cuts_by_count_bytes_and_age_with_stable_keys() -> None:
    attempt = uuid4()
    batcher = Batcher(attempt, max_records=3, max_seconds=0.1, max_bytes=1000, outbox_size=100)
    timer = asyncio.create_task(batcher.run_timer())
    for n in range(4):
        await batcher.add({"type": "raw", "n": n}, 10)
    await batcher.add({"type": "raw", "big": True}, 995)  # would pass max_bytes: the pending one is cut first
    await wait_until(lambda: batcher.outbox.qsize() == 3, 5, what="the last batch to be cut by age")
    await batcher.finish()
    timer.cancel()
    cut = [batcher.outbox.get_nowait() for _ in range(batcher.outbox.qsize())]
    assert [(b.sequence_number, b.record_count, b.final) for b in cut] == [
        (1, 3, False), (2, 1, False), (3, 1, False), (4, 0, True)]
    assert [b.idempotency_key for b in cut] == [f"{attempt}:{n}" for n in (1, 2, 3, 4)]
    assert all(b.payload_sha256 == payload_sha256(b.payload) for b in cut)


async def test_lease_lost_on_renewal_stops_the_plugin_and_writes_nothing_more(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pid_file = tmp_path / "plugin.pid"
    write_plugin(plugins_dir, "endless", f"""
        #!/bin/sh
        echo $$ > {pid_file}
        exec sleep 60
    """)
    worker = await register_worker(gateway, ("endless",))
    task_id = await gateway.task(task_type="endless", lease_seconds=3)
    caplog.set_level(logging.INFO, logger="leasehold.worker")
    async with running_agent(worker.settings(gateway, plugins_dir=plugins_dir)):
        pid = await read_pid(pid_file)
        try:
            [acquired] = [r for r in caplog.records if r.getMessage() == "task acquired"]

            async def started() -> bool:  # the agent's start landed, so its renewal (not its start) meets the 409
                return (await task_state(gateway, task_id))[0] == "running"

            await wait_until(started, what="the agent's start to land")
            # Someone else with this worker's identity takes the lease over (a fresh token for the
            # same attempt): the agent's token is now stale, and its next renewal gets a 409.
            taken = await worker.client.acquire(request_id=acquired.request_id)  # type: ignore[attr-defined]
            assert taken.status == 200
            lost_at = time.monotonic()

            async def gone() -> bool:
                return not pid_alive(pid)

            await wait_until(gone, timeout=3 / 3 + 1.0 + 1.0, interval=0.02, what="the plugin to stop")
            assert time.monotonic() - lost_at < 3 / 3 + 1.0 + 1.0
            await wait_until(lambda: any(
                r.getMessage() == "lease lost; attempt abandoned" for r in caplog.records), what="lease lost")
        finally:
            kill_group(pid)
        # The new holder of the lease is untouched: no fail, no cancel-ack came from the agent.
        assert (await task_state(gateway, task_id))[0] == "running"
        [(rejected,)] = await rows(gateway, "SELECT count(*) FROM events WHERE originator_id = %s "
                                            "AND topic LIKE '%%WriteRejected'", task_id)
        assert rejected == 1  # the one stale renewal
        lease = taken.body["lease"]
        assert (await worker.client.final_batch(lease)).status == 200
        assert (await worker.client.write(lease, "complete")).status == 200
