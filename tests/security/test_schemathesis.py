"""Schemathesis against a real Gateway: every operation of ``/openapi.json``, every check.

Three runs of ``schemathesis run`` (examples, coverage, fuzzing and stateful phases; every
check, which is schemathesis' default), each against the Gateway this test starts, over TLS:

1. **worker**: the worker API and the service endpoints on the worker port, over mTLS with the
   client certificate of a registered worker that has tasks to lease (the stateful phase follows
   the acquire answer's links to renew, progress, results, complete, fail and cancel-ack);
2. **administrator**: the operator API with the administrator key;
3. **organisations**: the operator API with the keys of two organisations, declared peers, so
   the object-level authorization check also tries every object one created with the other's key.

Each run must end with zero failures and zero errors (no 5xx, no response outside its schema,
no undocumented status or content type, no schema-valid request refused, no invalid one
accepted, no object readable across organisations...). The requests it made are counted by the
Gateway itself (its ``leasehold_http_requests_total``), printed, and must reach a floor, so an
empty run fails; and the Gateway must have answered no 5xx at all.

Where the API has a rule no schema can state, ``schemathesis.toml`` and ``schemathesis_hooks.py``
say so, each with its reason. The longer run: ``tests/security/README.md``.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from leasehold.gateway.tls import PkiPaths
from support.gateway import ADMIN_KEY, RunningGateway, running_gateway

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: Test cases per operation and phase; the README's longer run raises it.
MAX_EXAMPLES = int(os.environ.get("LEASEHOLD_FUZZ_EXAMPLES", "10"))
#: Requests each run must at least have made, and have had accepted (the Gateway counts them).
FLOOR, ACCEPTED_FLOOR = 250, 25


def command(base_url: str, config: Path, *, ca: Path, report_dir: Path, tags: tuple[str, ...],
            options: list[str]) -> list[str]:
    argv = [str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(config), "run",
            f"{base_url}/openapi.json", "--max-examples", str(MAX_EXAMPLES), "--tls-verify", str(ca), "--no-color",
            "--report", "json", "--report-dir", str(report_dir), *options]
    for tag in tags:
        argv += ["--include-tag", tag]
    return argv


async def answered(gateway: RunningGateway) -> dict[str, int]:
    """Requests the Gateway has answered so far, by status (its own Prometheus counter)."""
    ctx = ssl.create_default_context(cafile=str(gateway.pki.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, \
            s.get(gateway.operator_url + "/metrics") as r:
        text = await r.text()
    by_status: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "leasehold_http_requests_total":
                status = sample.labels["status"]
                by_status[status] = by_status.get(status, 0) + int(sample.value)
    return by_status


async def run(name: str, argv: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(*argv, env=env, cwd=cwd, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    output, _ = await proc.communicate()
    text = output.decode(errors="replace")
    reports = sorted((cwd / name).glob("*.json"))
    assert proc.returncode == 0 and reports, f"schemathesis run '{name}' failed:\n{text[-30000:]}"
    report: dict[str, Any] = json.loads(reports[-1].read_text())
    assert report["failures"] == [] and report["errors"] == [], text[-30000:]
    assert report["operations"]["tested"] == report["operations"]["selected"] > 0, report["operations"]
    return report


@pytest.mark.slow
async def test_schemathesis_finds_nothing(database_url: str, pki: PkiPaths, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # Long-polls are capped at 1 s (the schema allows 30) and the rate limits (per certificate, failed keys) are out
    # of the way: the budget is for test cases, and both limits have tests of their own.
    async with running_gateway(database_url, pki, max_wait_seconds=1, rate_limit_per_second=1e6,
                               rate_limit_burst=1_000_000, auth_failure_burst=1_000_000) as gw:
        worker = await gw.worker(capacity=1000)
        for _ in range(50):
            await gw.task()
        keys = {}
        for name in ("organisation-a", "organisation-b"):
            org = await gw.operator("POST", "/v1/organizations", {"name": name})
            key = await gw.operator("POST", f"/v1/organizations/{org.body['id']}/api-keys", {"name": "fuzzing"})
            assert key.status == 201, key.body
            keys[name] = key.body["key"]
        # The organisations' run: the two keys as Web Fuzzing Commons users, peers of each other.
        # The first one sends every request (pinned: otherwise an operation refused with 403, such
        # as replacing a global profile, moves on to the other key, and a chain "create as A,
        # change as B" would read B's 404 as the created object gone); B is used to probe A's objects.
        wfc = tmp_path / "organisations.json"
        wfc.write_text(json.dumps({"auth": [
            {"name": name, "fixedHeaders": [{"name": "Authorization", "value": f"Bearer {key}"}]}
            for name, key in keys.items()]}))
        base = (HERE / "schemathesis.toml").read_text()
        peers = tmp_path / "organisations.toml"
        peers.write_text(base + f'\n[auth.wfc]\npath = "{wfc}"\nuser = "organisation-a"\n'
                                f'peers = {json.dumps(list(keys))}\n')

        certs = pki.directory / "workers"
        env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
               "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])}
        runs: list[tuple[str, str, Path, tuple[str, ...], list[str], dict[str, str]]] = [
            ("worker", gw.worker_url, HERE / "schemathesis.toml", ("worker",),
             ["--request-cert", str(certs / f"{worker.name}.pem"),
              "--request-cert-key", str(certs / f"{worker.name}-key.pem")], {}),
            ("administrator", gw.operator_url, HERE / "schemathesis.toml", ("operator", "service"),
             ["--header", f"Authorization: Bearer {ADMIN_KEY}"], {"LEASEHOLD_FUZZ_ORGANIZATION": str(gw.org)}),
            ("organisations", gw.operator_url, peers, ("operator",), [], {}),
        ]
        lines = []
        for name, url, config, tags, options, extra in runs:
            before, started = await answered(gw), time.monotonic()
            argv = command(url, config, ca=pki.ca_cert, report_dir=tmp_path / name, tags=tags, options=options)
            report = await run(name, argv, {**env, **extra}, tmp_path)
            after = await answered(gw)
            by_class: dict[str, int] = {}
            for status, n in after.items():
                by_class[status[0] + "xx"] = by_class.get(status[0] + "xx", 0) + n - before.get(status, 0)
            by_class["2xx"] -= 1  # not the /metrics read of `answered`
            made = sum(by_class.values())
            classes = ", ".join(f"{k} {v}" for k, v in sorted(by_class.items()) if v)
            lines.append(f"schemathesis {name}: {made} requests ({classes}), "
                         f"{report['test_cases']['generated']} test cases, {report['operations']['tested']} "
                         f"operations, 0 failures, {time.monotonic() - started:.0f} s (seed {report['seed']})")
            assert made >= FLOOR and by_class.get("2xx", 0) >= ACCEPTED_FLOOR, lines[-1]  # not only refusals
        server_errors = {status: n for status, n in (await answered(gw)).items() if status.startswith("5")}
        assert server_errors == {}, f"the Gateway answered 5xx: {server_errors}"
    with capsys.disabled():
        print("\n" + "\n".join(lines))
