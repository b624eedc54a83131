"""``leasehold scans|tasks|workers|counts``: the real console script against a running Gateway,
through the Python client, in an environment where the server's packages cannot be imported
(they need only the base install)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from uuid import UUID

import orjson
import pytest

from support.gateway import ADMIN_KEY, RunningGateway
from support.slim import LEASEHOLD, without_server_env


@pytest.fixture(scope="module")
def base_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return without_server_env(tmp_path_factory.mktemp("client-only"))


async def leasehold(gateway: RunningGateway, env: dict[str, str], *args: str,
                    key: str | None = ADMIN_KEY) -> tuple[int, str, str]:
    environment = {k: v for k, v in env.items() if k != "LEASEHOLD_API_KEY"}
    if key is not None:
        environment["LEASEHOLD_API_KEY"] = key
    proc = await asyncio.create_subprocess_exec(
        str(LEASEHOLD), *args, "--url", gateway.operator_url, "--ca-file", str(gateway.pki.ca_cert),
        env=environment, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def failed_task(gateway: RunningGateway) -> UUID:
    task = await gateway.task(max_attempts=1, priority=10)
    worker = await gateway.worker()
    lease = (await worker.acquire()).body["lease"]
    assert lease["task"]["id"] == str(task)
    assert (await worker.write(lease, "fail", error="scanner crashed", retryable=False)).status == 200
    return task


async def test_find_and_retry_work_from_the_command_line(gateway: RunningGateway, base_env: dict[str, str]) -> None:
    others = [await gateway.task(task_type="crawl") for _ in range(3)]
    task = await failed_task(gateway)  # the scan still runs: its other tasks wait

    code, out, err = await leasehold(gateway, base_env, "tasks", "list", "--state", "failed_terminal", "--json")
    assert code == 0, err
    assert [orjson.loads(line)["id"] for line in out.splitlines()] == [str(task)]

    code, out, err = await leasehold(gateway, base_env, "tasks", "list", "--type", "crawl", "--limit", "2")
    assert code == 0 and len(out.splitlines()) == 2 and "more: --cursor " in err
    cursor = err.split("--cursor ")[1].strip()
    code, out2, _ = await leasehold(gateway, base_env, "tasks", "list", "--type", "crawl", "--limit", "1", "--all",
                                    "--cursor", cursor)  # the rest, a page at a time
    assert code == 0
    listed = [line.split()[0] for line in out.splitlines() + out2.splitlines()]
    assert sorted(listed) == sorted(str(t) for t in others)

    code, out, err = await leasehold(gateway, base_env, "tasks", "retry", str(task), "--reason", "fixed", "--attempts", "2")
    assert code == 0, err
    assert out.startswith(f"{task}  pending  probe  attempts 1/3")
    code, out, err = await leasehold(gateway, base_env, "tasks", "retry", str(task))
    assert (code, out) == (1, "") and err.startswith("leasehold: error: 409 Conflict: only a failed_terminal task")

    code, out, _ = await leasehold(gateway, base_env, "scans", "show", str(gateway.scan))
    assert code == 0 and out.startswith(str(gateway.scan)) and "jobs: 4" in out and str(task) in out
    code, out, _ = await leasehold(gateway, base_env, "scans", "list", "--status", "running", "--json")
    assert code == 0 and [orjson.loads(line)["id"] for line in out.splitlines()] == [str(gateway.scan)]
    code, out, _ = await leasehold(gateway, base_env, "counts", "--json")
    (org,) = orjson.loads(out)["organizations"]
    assert org["tasks_by_state"]["pending"] == 4 and org["queue"]["depth"] == 4
    code, out, _ = await leasehold(gateway, base_env, "workers", "list")
    assert code == 0 and "last seen 20" in out and " last poll " in out
    worker_lines = [line for line in out.splitlines() if not line.startswith(" ")]
    assert worker_lines and all(line.split()[3] in ("live", "idle", "gone") for line in worker_lines)
    code, out, _ = await leasehold(gateway, base_env, "workers", "list", "--liveness", "gone", "--json")
    assert code == 0 and {orjson.loads(line)["liveness"] for line in out.splitlines()} <= {"gone"}


async def test_command_line_errors_are_one_line(gateway: RunningGateway, base_env: dict[str, str],
                                                tmp_path: Path) -> None:
    code, out, err = await leasehold(gateway, base_env, "counts", key=None)
    assert (code, out) == (2, "") and err == "leasehold: error: no API key: set LEASEHOLD_API_KEY or pass --api-key-file FILE\n"
    code, out, err = await leasehold(gateway, base_env, "counts", key="wrong")
    assert (code, out) == (1, "") and err.startswith("leasehold: error: 401 Unauthorized: ") and err.count("\n") == 1
    key_file = tmp_path / "key"
    key_file.write_text(ADMIN_KEY + "\n")
    code, out, err = await leasehold(gateway, base_env, "counts", "--api-key-file", str(key_file), key=None)
    assert code == 0, err
    code, _, err = await leasehold(gateway, base_env, "tasks", "list", "--created-from", "2026-01-01T00:00:00")
    assert code == 2 and "offset" in err
    code, _, err = await leasehold(gateway, base_env, "tasks", "show", "not-a-task")
    assert code == 1 and err.startswith("leasehold: error: 404 Not Found: ")
    env = {**base_env, "LEASEHOLD_API_KEY": ADMIN_KEY}
    proc = await asyncio.create_subprocess_exec(str(LEASEHOLD), "counts", "--url", "https://127.0.0.1:9",
                                                env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    _, err_b = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1 and err_b.decode().startswith("leasehold: error: cannot reach the operator API")


async def test_show_json_of_a_row_stored_past_the_limits_says_what_it_clipped(
        gateway: RunningGateway, base_env: dict[str, str]) -> None:
    """A task and scan stored before the input limits (jsonb 300 deep, written with SQL) show with
    ``--json``: exit 0, the too-deep part a marker, ``<field>_clipped`` true."""
    task = await gateway.task()
    async with gateway.pool.connection() as conn:
        deep = '{"a": ' * 300 + "1" + "}" * 300
        await conn.execute("UPDATE worker_tasks SET scope = %s::jsonb WHERE id = %s", (deep, task))
        await conn.execute("UPDATE scans SET targets = %s::jsonb WHERE id = %s", (deep, gateway.scan))
    code, out, err = await leasehold(gateway, base_env, "tasks", "show", str(task), "--json")
    assert code == 0, err
    shown = orjson.loads(out)
    assert (shown["scope_clipped"], shown["parameters_clipped"]) == (True, False)
    code, out, err = await leasehold(gateway, base_env, "scans", "show", str(gateway.scan), "--json")
    assert code == 0, err
    assert orjson.loads(out)["scan"]["targets_clipped"] is True
