"""The Gateway seals on its own every ``seal_interval_seconds`` and on demand (``POST /v1/seals``,
administrators only); each seal is signed with the key file it was given and appended to the
digest directory, and ``verify-chain --digests`` accepts them."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from replay_support import cli_json

from leasehold.gateway.settings import GatewaySettings
from leasehold.gateway.tls import PkiPaths
from leasehold.persistence.seals import generate_keypair
from support.gateway import RunningGateway, running_gateway
from support.waits import wait_until


def records(directory: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for f in sorted(directory.glob("digests-*.jsonl")) for line in f.read_bytes().splitlines()]


async def test_the_gateway_seals_periodically_and_on_demand(database_url: str, pki: PkiPaths, tmp_path: Path) -> None:
    key, public, digests = tmp_path / "k.pem", tmp_path / "p.pem", tmp_path / "digests"
    generate_keypair(key, public)
    async with running_gateway(database_url, pki, seal_key_file=key, digest_dir=digests,
                               seal_interval_seconds=0.2) as gw:
        await wait_until(lambda: len(records(digests)) >= 2, 10, what="two periodic seals (the loop publishes by itself)")
        await gw.task()
        reply = await gw.operator("POST", "/v1/seals")
        assert reply.status == 201, reply.body
        assert reply.body["signature"] and reply.body["key_id"] and reply.body["position"] > 0
        assert reply.body in records(digests)
        org_key = (await gw.registry.create_api_key(organization_id=gw.org, name="org")).key
        assert (await gw.operator("POST", "/v1/seals", key=org_key)).status == 403
    code, report = await cli_json("replay", "verify-chain", "--database-url", database_url, "--digests",
                                  str(digests), "--public-key", str(public))
    assert code == 0 and report["problems"] == [], report
    assert report["digests"]["records"] == len(records(digests)) >= 3


async def test_seal_on_demand_without_a_key_is_409(gateway: RunningGateway) -> None:
    reply = await gateway.operator("POST", "/v1/seals")
    assert reply.status == 409 and reply.headers["Content-Type"].startswith("application/problem+json")


def test_the_key_and_the_sink_go_together(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="go together"):
        GatewaySettings(seal_key_file=tmp_path / "k.pem")
