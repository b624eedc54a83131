"""``replay export`` writes an audit bundle; ``replay verify-bundle`` checks it offline and
fails on any change to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from replay_support import cli, cli_json

from leasehold.persistence.checkpoints import write_checkpoint
from leasehold.persistence.connection import connect
from leasehold.replay.bundle import verify_bundle
from support.core import World


async def finished_scan(world: World) -> list[Any]:
    worker = await world.worker(capacity=2)
    first, second = await world.running(worker), await world.leased(worker)
    for a, records in ((first, [{"type": "asset", "value": "é€", "n": 1.5}]), (second, [])):
        await world.lifecycle.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
        await world.lifecycle.submit_batch(worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=1,
                                           idempotency_key="part", payload_sha256=_sha(records), records=records,
                                           final=False)
        await world.final_batch(worker, a, sequence=2, key="last")
        await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)
    return [first, second]


def _sha(records: list[Any]) -> str:
    from leasehold.domain.results import payload_sha256

    return payload_sha256(records)


def rewrite(path: Path, change: Any, *, fix_manifest: bool = True) -> None:
    """Apply ``change`` to the parsed lines of a bundle file; optionally fix the manifest's hashes."""
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    change(lines)
    data = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    path.write_bytes(data)
    if fix_manifest:
        import hashlib

        manifest_path = path.with_name("manifest.json")
        manifest = orjson.loads(manifest_path.read_bytes())
        manifest["files"][path.name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                                        "lines": len(lines)}
        manifest_path.write_bytes(orjson.dumps(manifest))


@pytest.fixture
async def bundle(world: World, database_url: str, tmp_path: Path) -> Path:
    await finished_scan(world)
    async with await connect(database_url) as conn:
        await write_checkpoint(conn)
    out = tmp_path / "scan-bundle"
    code, report = await cli_json("replay", "export", "--scan", str(world.scan), str(out),
                                  "--database-url", database_url)
    assert code == 0 and report["chain_problems"] == []
    assert (report["streams"], report["batches"]) == (3, 4)
    return out


async def test_an_exported_scan_bundle_verifies_offline(bundle: Path, world: World,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/nothing")  # never used
    code, out, err = await cli("replay", "verify-bundle", str(bundle))
    assert code == 0, out + err
    assert out.startswith("OK: ") and "in 3 streams, 4 batches" in out
    manifest = orjson.loads((bundle / "manifest.json").read_bytes())
    assert manifest["subject"] == {"kind": "scan", "id": str(world.scan)}
    assert {s["type"] for s in manifest["streams"]} == {"scan", "task"}
    assert set(manifest["checkpoint"]["sealed_heads"]) == {s["originator_id"] for s in manifest["streams"]}
    events = [orjson.loads(line) for line in (bundle / "events.jsonl").read_bytes().splitlines()]
    assert [e["notification_id"] for e in events] == sorted(e["notification_id"] for e in events)
    assert set(events[0]) >= {"notification_id", "originator_id", "originator_version", "topic", "state",
                              "recorded_at", "transaction_id", "prev_hash", "hash"}
    assert isinstance(events[0]["state"], dict) and "state_raw_base64" not in events[0]
    batches = [orjson.loads(line) for line in (bundle / "batches.jsonl").read_bytes().splitlines()]
    assert [b["payload"] for b in batches if b["idempotency_key"] == "part"] == [
        [{"type": "asset", "value": "é€", "n": 1.5}], []]


async def test_a_task_bundle_verifies(world: World, database_url: str, tmp_path: Path) -> None:
    first, _ = await finished_scan(world)
    code, out, _ = await cli("replay", "export", str(first.task.id), str(tmp_path / "t"),
                             "--database-url", database_url)
    assert code == 0 and "manifest.json sha256" in out
    summary, problems = verify_bundle(tmp_path / "t")
    assert problems == [] and summary["streams"] == 1 and summary["batches"] == 2
    code, _, err = await cli("replay", "export", str(first.task.id), str(tmp_path / "t"),
                             "--database-url", database_url)
    assert code == 1 and "not an empty directory" in err


def test_an_edited_event_breaks_the_chain_in_the_bundle(bundle: Path) -> None:
    def edit(lines: list[Any]) -> None:
        lines[3]["state"]["actor"] = "operator:someone-else"

    rewrite(bundle / "events.jsonl", edit)
    _, problems = verify_bundle(bundle)
    assert len(problems) == 1 and "hash does not match the event's content (edited)" in problems[0]


def test_a_removed_event_is_reported(bundle: Path) -> None:
    rewrite(bundle / "events.jsonl", lambda lines: lines.pop(5))
    _, problems = verify_bundle(bundle)
    assert any("events missing or inserted" in p for p in problems)
    assert any("the manifest says" in p for p in problems)


def test_an_edited_payload_fails_its_sha256(bundle: Path) -> None:
    def edit(lines: list[Any]) -> None:
        lines[0]["payload"] = [{"type": "asset", "kind": "host", "value": "forged"}]

    rewrite(bundle / "batches.jsonl", edit)
    _, problems = verify_bundle(bundle)
    assert len(problems) == 1 and "payload sha256 is" in problems[0]


async def test_any_change_without_fixing_the_manifest_fails_the_file_hash(bundle: Path) -> None:
    with (bundle / "batches.jsonl").open("ab") as f:
        f.write(b"\n")
    code, out, _ = await cli("replay", "verify-bundle", str(bundle))
    assert code == 1 and "batches.jsonl: sha256 is" in out and "PROBLEM" in out


def test_a_forged_manifest_head_is_reported(bundle: Path) -> None:
    manifest = orjson.loads((bundle / "manifest.json").read_bytes())
    manifest["streams"][0]["head_version"] += 1
    (bundle / "manifest.json").write_bytes(orjson.dumps(manifest))
    _, problems = verify_bundle(bundle)
    assert len(problems) == 1 and "the manifest says" in problems[0]
