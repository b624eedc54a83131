"""Scopes of any size with the real agent and the real plugins: a scan that finds a lot runs every
step of its profile to the end, each step's scope read page by page by the agent and handed whole
to the plugin."""

from __future__ import annotations

import asyncio
import resource
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

import pytest

from leasehold.domain.events import ProfileStep
from support.agent import eventually, records, register_worker, rows, running_agent
from support.gateway import RunningGateway

PORTS = 1_600


def raise_open_files_limit(needed: int) -> None:
    """Lift the soft limit on open files to ``needed`` (up to the hard limit): the test's servers,
    the Gateway's and the agent's connections all live in this process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        pytest.skip(f"needs {needed} open files, the hard limit is {hard}")


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A web page naming the port to an HTTP request; a TLS handshake (its first byte is 0x16) is
    hung up on at once, so the probes learn quickly that this is plain HTTP."""
    port = writer.get_extra_info("sockname")[1]
    try:
        first = await asyncio.wait_for(reader.readexactly(1), 5)
        if first == b"\x16":
            return
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        body = f"<html><head><title>port {port}</title></head></html>".encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()


@asynccontextmanager
async def listening_ports(count: int) -> AsyncIterator[list[int]]:
    """``count`` real listening ports on 127.0.0.1, each answering HTTP; yields the port numbers."""
    servers: list[asyncio.Server] = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
            servers.append(await asyncio.start_server(answer, sock=sock, backlog=64))
        yield [s.sockets[0].getsockname()[1] for s in servers]
    finally:
        for server in servers:
            server.close()
        for server in servers:
            await server.wait_closed()


async def scan_status(gateway: RunningGateway, scan: UUID) -> str:
    [(status,)] = await rows(gateway, "SELECT status FROM scans WHERE id = %s", scan)
    return str(status)


@pytest.mark.slow
@pytest.mark.timeout(900)  # about 30 s alone; several times that while the machine is loaded
async def test_a_scan_of_1600_open_ports_runs_tcp_connect_http_probe_and_tls_inspect_to_the_end(
        gateway: RunningGateway) -> None:
    """tcp-connect finds 1,600 open loopback ports; its final batch used to be refused (413) because
    the next step's scope was larger than a client's 64 KiB, so the scan failed and http-probe never
    ran. Now http-probe gets every service (its scope in pages) and so does tls-inspect."""
    raise_open_files_limit(PORTS * 4 + 1_000)
    worker = await register_worker(gateway, ("tcp-connect", "http-probe", "tls-inspect"))
    profile = (ProfileStep(task_type="tcp-connect", execution_timeout_seconds=600),
               ProfileStep(task_type="http-probe", execution_timeout_seconds=600),
               ProfileStep(task_type="tls-inspect", execution_timeout_seconds=600))
    async with listening_ports(PORTS) as ports:
        scan = await gateway.scans.create_scan(gateway.org, {"targets": ["127.0.0.1"], "ports": ports},
                                               profile=profile)
        async with running_agent(worker.settings(gateway)):
            async def ended() -> str | None:
                status = await scan_status(gateway, scan)
                return status if status in ("success", "failed", "cancelled") else None

            assert await eventually(ended, within=600, interval=0.5, what="the scan to end") == "success"

    tasks = await rows(gateway, """
        SELECT t.id, t.task_type, t.state, t.attempt_count, t.scope_ref FROM worker_tasks t
        JOIN scan_jobs j ON j.id = t.scan_job_id WHERE t.scan_id = %s ORDER BY j.position""", scan)
    assert [(t[1], t[2], t[3]) for t in tasks] == [
        ("tcp-connect", "completed", 1), ("http-probe", "completed", 1), ("tls-inspect", "completed", 1)]
    services = {f"127.0.0.1:{port}/tcp" for port in ports}
    found: list[dict[str, Any]] = await records(gateway, tasks[0][0])
    assert {r["value"] for r in found if r["type"] == "asset" and r["kind"] == "service"} == services
    probe_ref, inspect_ref = tasks[1][4], tasks[2][4]
    assert probe_ref["assets"] == PORTS and probe_ref["pages"] > 1  # more than the lease carried
    probed = [r for r in await records(gateway, tasks[1][0]) if r["type"] == "asset" and r["kind"] == "url"]
    assert len(probed) == PORTS and {r["attributes"]["title"] for r in probed} == {f"port {p}" for p in ports}
    assert inspect_ref["assets"] == 2 * PORTS and inspect_ref["pages"] > probe_ref["pages"]
    # Plain HTTP services: every one was tried, and none shook hands.
    inspected = [r for r in await records(gateway, tasks[2][0]) if r["type"] == "raw"]
    assert {r["service"] for r in inspected if r.get("event") == "tls_handshake_failed"} == services
