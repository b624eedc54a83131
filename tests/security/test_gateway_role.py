"""The Gateway runs as a login role made by ``leasehold db create-app-role``: a member of
``leasehold_app`` only. A whole task lifecycle and a seal work over HTTP as that role, it cannot
rewrite the log, and the Gateway warns at start when it runs as a superuser or the tables' owner
(and not when it runs as that role)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from leasehold.gateway.keys import METRICS
from leasehold.gateway.tls import PkiPaths
from leasehold.persistence.seals import generate_keypair
from support.cli_runner import run_cli
from support.gateway import running_gateway
from support.waits import wait_until


@pytest.fixture
def app_login(database_url: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(role name, the Gateway URL printed by `leasehold db create-app-role`)."""
    name = f"lh_gw_{secrets.token_hex(4)}"
    code, out, err = run_cli("db", "create-app-role", "--database-url", database_url, "--name", name)
    assert code == 0, err
    assert f"created login role {name} (member of leasehold_app only)" in err
    yield name, out.strip()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def test_the_login_role_has_no_attribute_but_leasehold_app(app_login: tuple[str, str], database_url: str) -> None:
    name, url = app_login
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT rolsuper, rolcreatedb, rolcreaterole, rolbypassrls, rolreplication, rolcanlogin"
                           " FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
        assert row == (False, False, False, False, False, True)
        granted = conn.execute("SELECT b.rolname FROM pg_auth_members m JOIN pg_roles b ON b.oid = m.roleid"
                               " JOIN pg_roles r ON r.oid = m.member WHERE r.rolname = %s", (name,)).fetchall()
        assert granted == [("leasehold_app",)]
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (name,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM events")


async def test_the_gateway_works_as_the_app_role_and_does_not_warn(
        app_login: tuple[str, str], pki: PkiPaths, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _, url = app_login
    key, public = tmp_path / "k.pem", tmp_path / "p.pem"
    generate_keypair(key, public)
    caplog.set_level(logging.WARNING, logger="leasehold.gateway")
    async with running_gateway(url, pki, seal_key_file=key, digest_dir=tmp_path / "d",
                               metrics_sample_seconds=0.1) as gw:
        # The sampled gauges (queue, database round trip, partitions ahead) read as this role too.
        await wait_until(lambda: gw.app[METRICS].sampled_at is not None, 10, what="a sample as the app role")
        health = (await gw.operator("GET", "/v1/health")).body
        assert health["checks"]["partitions"]["state"] == "ok", health
        assert health["checks"]["digest_sink"]["state"] == "ok", health
        worker = await gw.worker()
        reply = await gw.operator("POST", f"/v1/scans/{gw.scan}/tasks", {"task_type": "probe"})
        assert reply.status == 201, reply.body
        lease = (await worker.acquire()).body["lease"]
        assert (await worker.final_batch(lease)).status in (200, 201)
        assert (await worker.write(lease, "complete")).status == 200
        assert (await gw.operator("POST", "/v1/seals")).status == 201
    assert not [r for r in caplog.records if "superuser" in r.getMessage() or "owner" in r.getMessage()]


async def test_the_gateway_warns_when_it_runs_as_a_superuser(
        database_url: str, pki: PkiPaths, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="leasehold.gateway")
    async with running_gateway(database_url, pki):
        pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("a superuser: it can rewrite the event log" in w and "create-app-role" in w for w in warnings)


def test_a_bad_role_name_is_a_usage_error(database_url: str) -> None:
    code, _, err = run_cli("db", "create-app-role", "--database-url", database_url, "--name", "Robert'); DROP")
    assert code == 2 and "lower-case identifier" in err
