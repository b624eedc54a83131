"""API keys have a lifecycle: created (optionally expiring), listed, revoked, rotated — by an
administrator over the operator API or with ``leasehold admin`` — with the last use recorded at
most once a minute; the bootstrap key replaces its predecessor when the Gateway restarts with a
new one; the request log names the key by its id, never by the key."""

from __future__ import annotations

import logging
import ssl
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest

from leasehold.gateway.tls import PkiPaths
from support.cli_runner import cli
from support.gateway import ADMIN_KEY, RunningGateway, running_gateway


async def org_key(gateway: RunningGateway, **body: Any) -> dict[str, Any]:
    reply = await gateway.operator("POST", "/v1/api-keys", {"name": "ci", "organization_id": str(gateway.org),
                                                              **body})
    assert reply.status == 201, reply.body
    return dict(reply.body)


async def status_with(gateway: RunningGateway, key: str) -> int:
    return (await gateway.operator("GET", f"/v1/organizations/{gateway.org}", key=key)).status


async def test_after_rotating_the_old_key_gets_401_on_its_very_next_request(gateway: RunningGateway) -> None:
    """On one keep-alive connection: the request right after the rotation is refused."""
    old = await org_key(gateway)
    ctx = ssl.create_default_context(cafile=str(gateway.pki.ca_cert))
    url = f"{gateway.operator_url}/v1/organizations/{gateway.org}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=1)) as session:
        async def get(key: str) -> int:
            async with session.get(url, headers={"Authorization": f"Bearer {key}"}) as r:
                await r.read()
                return r.status

        assert await get(old["key"]) == 200
        rotated = await gateway.operator("POST", f"/v1/api-keys/{old['id']}/rotate", {})
        assert rotated.status == 201, rotated.body
        assert rotated.body["replaces"] == old["id"] and rotated.body["name"] == "ci"
        assert rotated.body["organization_id"] == str(gateway.org) and rotated.body["key"] != old["key"]
        assert await get(old["key"]) == 401
        assert await get(rotated.body["key"]) == 200
    view = await gateway.operator("GET", f"/v1/api-keys/{old['id']}")
    assert view.body["revoked_at"] is not None and view.body["replaced_by"] == rotated.body["id"]
    again = await gateway.operator("POST", f"/v1/api-keys/{old['id']}/rotate", {})
    assert again.status == 409


async def test_revoke_list_and_who_may(gateway: RunningGateway) -> None:
    key = await org_key(gateway)
    assert await status_with(gateway, key["key"]) == 200
    listed = await gateway.operator("GET", f"/v1/api-keys?organization_id={gateway.org}")
    assert [k["id"] for k in listed.body["items"]] == [key["id"]]
    assert "key" not in listed.body["items"][0] and "key_hash" not in listed.body["items"][0]
    # An organisation key cannot manage keys, not even its own.
    for method, path, body in (("GET", "/v1/api-keys", None), ("POST", "/v1/api-keys", {"name": "x"}),
                               ("POST", f"/v1/api-keys/{key['id']}/revoke", None),
                               ("POST", f"/v1/api-keys/{key['id']}/rotate", {})):
        assert (await gateway.operator(method, path, body, key=key["key"])).status == 403
    revoked = await gateway.operator("POST", f"/v1/api-keys/{key['id']}/revoke")
    assert revoked.status == 200 and revoked.body["revoked_at"] is not None
    assert await status_with(gateway, key["key"]) == 401
    assert (await gateway.operator("POST", f"/v1/api-keys/{key['id']}/revoke")).body == revoked.body  # idempotent
    unknown = "00000000-0000-4000-8000-000000000000"
    for path in (f"/v1/api-keys/{unknown}/revoke", f"/v1/api-keys/{unknown}/rotate", "/v1/api-keys/nope/revoke"):
        reply = await gateway.operator("POST", path, {})
        assert reply.status == 404 and reply.headers["Content-Type"].startswith("application/problem+json")


async def test_an_expired_key_is_refused(gateway: RunningGateway) -> None:
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    assert (await gateway.operator("POST", "/v1/api-keys", {"name": "x", "expires_at": past})).status == 422
    naive = datetime.now().replace(microsecond=0).isoformat()  # no offset: refused, not guessed
    assert (await gateway.operator("POST", "/v1/api-keys", {"name": "x", "expires_at": naive})).status == 422
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    key = await org_key(gateway, expires_at=soon)
    assert datetime.fromisoformat(key["expires_at"]) == datetime.fromisoformat(soon)
    assert await status_with(gateway, key["key"]) == 200
    async with gateway.pool.connection() as conn:  # let the hour pass
        await conn.execute("UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE id = %s", (key["id"],))
    assert await status_with(gateway, key["key"]) == 401


async def test_last_use_is_recorded_at_most_once_a_minute(gateway: RunningGateway) -> None:
    key = await org_key(gateway)
    assert (await gateway.operator("GET", f"/v1/api-keys/{key['id']}")).body["last_used_at"] is None
    assert await status_with(gateway, key["key"]) == 200
    first = (await gateway.operator("GET", f"/v1/api-keys/{key['id']}")).body["last_used_at"]
    assert first is not None

    async def row_version() -> Any:
        return await gateway.count("SELECT xmin::text FROM api_keys WHERE id = %s", key["id"])

    before = await row_version()
    for _ in range(5):
        assert await status_with(gateway, key["key"]) == 200
    assert await row_version() == before  # no write for uses within the minute
    async with gateway.pool.connection() as conn:
        await conn.execute("UPDATE api_keys SET last_used_at = now() - interval '61 seconds' WHERE id = %s",
                           (key["id"],))
    assert await status_with(gateway, key["key"]) == 200
    later = (await gateway.operator("GET", f"/v1/api-keys/{key['id']}")).body["last_used_at"]
    assert datetime.fromisoformat(later) >= datetime.fromisoformat(first)


async def test_the_bootstrap_key_replaces_its_predecessor_on_restart(database_url: str, pki: PkiPaths) -> None:
    async with running_gateway(database_url, pki) as first:
        assert await status_with(first, ADMIN_KEY) == 200
    async with running_gateway(database_url, pki, admin_api_key="the-next-admin-key-0123456789") as second:
        assert await status_with(second, ADMIN_KEY) == 401
        assert await status_with(second, "the-next-admin-key-0123456789") == 200
        listed = (await second.operator("GET", "/v1/api-keys", key="the-next-admin-key-0123456789")).body["items"]
        bootstrap = [(k["revoked_at"] is None) for k in listed if k["bootstrap"]]
        assert sorted(bootstrap) == [False, True]
    # Starting again with the revoked key does not bring it back.
    async with running_gateway(database_url, pki) as third:
        assert await status_with(third, ADMIN_KEY) == 401
        assert await status_with(third, "the-next-admin-key-0123456789") == 200


async def test_the_request_log_names_the_key_id_never_the_key(gateway: RunningGateway,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    key = await org_key(gateway)
    caplog.set_level(logging.INFO, logger="leasehold.gateway")
    assert await status_with(gateway, key["key"]) == 200
    lines = [r for r in caplog.records if r.getMessage() == "request" and getattr(r, "route", "").startswith(
        "/v1/organizations/")]
    assert lines and lines[-1].operator_key_id == key["id"]  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if key["key"] in str(r.__dict__)]


async def test_the_admin_cli_lists_rotates_and_revokes(gateway: RunningGateway) -> None:
    url = gateway.settings.database_url
    assert url is not None
    code, out, err = await cli("admin", "create-key", "--organization", str(gateway.org), "--name", "cli",
                               "--expires-at", "2999-01-01T00:00:00", "--database-url", url)
    assert code == 0 and "expires 2999-01-01T00:00:00+00:00" in err
    created = out.strip()
    code, out, _ = await cli("admin", "list-keys", "--organization", str(gateway.org), "--json", "--database-url", url)
    import orjson

    rows = [orjson.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["name"] for r in rows] == ["cli"] and created not in out
    key_id = rows[0]["id"]
    code, out, err = await cli("admin", "rotate-key", key_id, "--database-url", url)
    assert code == 0 and f"revoked {key_id}" in err
    new = out.strip()
    assert await status_with(gateway, created) == 401 and await status_with(gateway, new) == 200
    code, out, _ = await cli("admin", "list-keys", "--organization", str(gateway.org), "--json", "--database-url", url)
    new_id = next(orjson.loads(line)["id"] for line in out.splitlines() if orjson.loads(line)["revoked_at"] is None)
    code, _, err = await cli("admin", "revoke-key", new_id, "--database-url", url)
    assert code == 0 and await status_with(gateway, new) == 401
    code, _, err = await cli("admin", "revoke-key", "not-a-uuid", "--database-url", url)
    assert code == 2 and "KEY_ID must be a UUID" in err
