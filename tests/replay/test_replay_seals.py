"""Signed seals held outside the database (``leasehold seal``, ``replay verify-chain --digests``).

Every kind of tampering, by the superuser (triggers bypassed, and the database's own checkpoints
wiped where that would hide the change) and by the application role ``leasehold_app`` (which
may only append), is either reported as a problem by ``verify-chain --digests PATH --public-key
KEY`` or, when it lies after the newest seal, reported inside the unsealed window. A bundle whose
lines were removed and whose manifest was recomputed fails ``verify-bundle --public-key``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import orjson
import psycopg
import pytest
from replay_support import cli, cli_json, tamper
from test_replay_tamper import stream, three_finished_tasks

from leasehold.persistence.chain import GENESIS, chain_hash
from leasehold.persistence.connection import connect
from leasehold.persistence.seals import DirectorySink, Sealer, generate_keypair, load_private_key
from support.core import World

APP = "leasehold_app"
WIPE_CHECKPOINTS = ("DELETE FROM checkpoint_heads", "DELETE FROM checkpoints")


class Sealed:
    """Three finished tasks, a key pair and a digest directory holding one seal over them."""

    def __init__(self, url: str, tasks: list[UUID], tmp: Path) -> None:
        self.url, self.tasks = url, tasks
        self.key, self.public = tmp / "seal-key.pem", tmp / "seal-public.pem"
        self.digests = tmp / "digests"

    async def seal(self) -> dict[str, Any]:
        code, record = await cli_json("seal", "now", "--signing-key", str(self.key), "--digest-dir",
                                      str(self.digests), "--database-url", self.url)
        assert code == 0
        return dict(record)

    async def verify(self) -> tuple[int, dict[str, Any]]:
        code, report = await cli_json("replay", "verify-chain", "--database-url", self.url,
                                      "--digests", str(self.digests), "--public-key", str(self.public))
        return code, report

    async def problems(self) -> list[tuple[str | None, int | None, str, str]]:
        code, report = await self.verify()
        found = [(p["stream"], p["version"], p["source"], p["problem"]) for p in report["problems"]]
        assert (code == 1) == bool(found)
        return found


@pytest.fixture
async def sealed(world: World, database_url: str, tmp_path: Path) -> Sealed:
    s = Sealed(database_url, await three_finished_tasks(world), tmp_path)
    generate_keypair(s.key, s.public)
    await s.seal()
    code, report = await s.verify()
    assert code == 0 and report["problems"] == []
    assert report["digests"]["records"] == 1
    assert report["digests"]["unsealed"]["events"] == 0
    return s


def forged_stream(url: str, *, backdated: bool = False) -> UUID:
    """A new stream of one correctly hashed TaskCreated event, copied from an existing one."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT topic, state FROM events WHERE topic LIKE '%:TaskCreated' LIMIT 1").fetchone()
    assert row is not None
    topic, state = row[0], bytes(row[1])
    oid = uuid4()
    columns = "originator_id, originator_version, topic, state, prev_hash, hash"
    values: tuple[Any, ...] = (oid, 1, topic, state, GENESIS, chain_hash(GENESIS, oid, 1, topic, state))
    if backdated:  # claim an old transaction, as if it had been there before the seal
        columns += ", transaction_id"
        values += ("3",)
    placeholders = ", ".join(["%s"] * len(values))
    as_app(url, f"INSERT INTO events ({columns}) VALUES ({placeholders})", values)  # noqa: S608
    return oid


def as_app(url: str, statement: str, params: tuple[Any, ...] = ()) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(f"SET ROLE {APP}")
        conn.execute(statement, params)
        conn.commit()


def appended_event(url: str, task_id: UUID) -> tuple[Any, ...]:
    """A correctly hashed event after the stream's head (a copy of its v4 event)."""
    events = stream(url, task_id)
    version, _, _, _, last_hash = events[-1]
    topic, state = events[3][1], events[3][2]
    return (task_id, version + 1, topic, state, last_hash, chain_hash(last_hash, task_id, version + 1, topic, state))


INSERT = "INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash) VALUES (%s, %s, %s, %s, %s, %s)"


# --- the superuser ----------------------------------------------------------------------------


async def test_an_edited_event_is_reported(sealed: Sealed) -> None:
    t = sealed.tasks[1]
    tamper(sealed.url, ("UPDATE events SET state = convert_to(replace(convert_from(state, 'UTF8'),"
                        " '\"priority\":0', '\"priority\":9'), 'UTF8') WHERE originator_id = %s"
                        " AND originator_version = 1", (t,)), *WIPE_CHECKPOINTS)
    found = await sealed.problems()
    assert (str(t), 1, "chain", "hash does not match the event's content (edited)") in found


async def test_an_edited_event_with_every_hash_recomputed_is_reported(sealed: Sealed) -> None:
    """The chains verify again after the rewrite; only the sealed head shows it."""
    t = sealed.tasks[0]
    events = stream(sealed.url, t)
    prev, statements = GENESIS, []
    for version, topic, state, _, _ in events:
        if version == 2:
            state = state.replace(b'"priority":0', b'"priority":9') if b'"priority":0' in state else state + b" "
        h = chain_hash(prev, t, version, topic, state)
        statements.append(("UPDATE events SET state = %s, prev_hash = %s, hash = %s WHERE originator_id = %s"
                           " AND originator_version = %s", (state, prev, h, t, version)))
        prev = h
    tamper(sealed.url, *statements, *WIPE_CHECKPOINTS)
    found = await sealed.problems()
    assert [(s, v, src) for s, v, src, _ in found if src != "digest" or s] == [(str(t), len(events), "digest")]
    assert "hash differs from the one a digest sealed" in found[-1][3]


async def test_a_deleted_middle_event_is_reported(sealed: Sealed) -> None:
    t = sealed.tasks[0]
    tamper(sealed.url, ("DELETE FROM events WHERE originator_id = %s AND originator_version = 3", (t,)),
           *WIPE_CHECKPOINTS)
    found = await sealed.problems()
    assert (str(t), 4, "chain") in [(s, v, src) for s, v, src, _ in found]


async def test_a_deleted_tail_is_reported(sealed: Sealed) -> None:
    t = sealed.tasks[1]
    head = len(stream(sealed.url, t))
    tamper(sealed.url, ("DELETE FROM events WHERE originator_id = %s AND originator_version > %s", (t, head - 2)),
           *WIPE_CHECKPOINTS)
    found = await sealed.problems()
    assert (str(t), head, "digest", f"tail removed: a digest sealed v{head}, but the log ends at v{head - 2}") in found


async def test_a_deleted_stream_is_reported(sealed: Sealed) -> None:
    t = sealed.tasks[2]
    head = len(stream(sealed.url, t))
    tamper(sealed.url, ("DELETE FROM events WHERE originator_id = %s", (t,)), *WIPE_CHECKPOINTS)
    found = await sealed.problems()
    assert (str(t), head, "digest", "stream deleted: a digest sealed it, but the log has no event of it") in found
    code, out, _ = await cli("replay", "verify-chain", "--database-url", sealed.url, "--digests",
                             str(sealed.digests), "--public-key", str(sealed.public))
    assert code == 1 and f"stream {t} v{head}: stream deleted" in out


async def test_swapped_events_are_reported(sealed: Sealed) -> None:
    t = sealed.tasks[2]
    events = stream(sealed.url, t)
    (v2, topic2, state2, _, _), (v3, topic3, state3, _, _) = events[1], events[2]
    tamper(sealed.url,
           ("UPDATE events SET topic = %s, state = %s WHERE originator_id = %s AND originator_version = %s",
            (topic3, state3, t, v2)),
           ("UPDATE events SET topic = %s, state = %s WHERE originator_id = %s AND originator_version = %s",
            (topic2, state2, t, v3)), *WIPE_CHECKPOINTS)
    found = await sealed.problems()
    assert (str(t), 2, "chain") in [(s, v, src) for s, v, src, _ in found]


async def test_a_deleted_newest_checkpoint_is_reported_and_so_is_the_tail_it_sealed(sealed: Sealed) -> None:
    record = await sealed.seal()
    cid = record["checkpoint_id"]
    tamper(sealed.url, ("DELETE FROM checkpoint_heads WHERE checkpoint_id = %s", (cid,)),
           ("DELETE FROM checkpoints WHERE id = %s", (cid,)))
    found = await sealed.problems()
    assert (None, None, "digest", f"checkpoint {cid} of the digests is missing from the database (deleted)") in found
    t = sealed.tasks[0]
    head = len(stream(sealed.url, t))
    tamper(sealed.url, ("DELETE FROM events WHERE originator_id = %s AND originator_version = %s", (t, head)))
    found = await sealed.problems()
    assert (str(t), head, "digest", f"tail removed: a digest sealed v{head}, but the log ends at v{head - 1}") in found
    # The next seal chains to the checkpoint before the deleted one: the digests show the fork.
    await sealed.seal()
    messages = [m for _, _, _, m in await sealed.problems()]
    assert any("does not chain to the digest before it" in m for m in messages)


async def test_a_forged_stream_backdated_before_the_seal_is_reported(sealed: Sealed) -> None:
    oid = forged_stream(sealed.url, backdated=True)
    found = await sealed.problems()
    assert [(s, v, src) for s, v, src, _ in found] == [(str(oid), 1, "digest")]
    assert "event added: a stream no digest sealed, yet written before the newest digest" in found[0][3]


async def test_a_tampered_digest_line_is_reported(sealed: Sealed) -> None:
    """Someone who can write the sink but has no key cannot edit a record unnoticed."""
    path = next(sealed.digests.glob("digests-*.jsonl"))
    record = orjson.loads(path.read_bytes().splitlines()[0])
    record["head_count"] += 1
    path.write_bytes(orjson.dumps(record) + b"\n")
    code, report = await sealed.verify()
    assert code == 1
    assert any("the signature does not match the record" in p["problem"] for p in report["problems"])


# --- the application role (append only) -------------------------------------------------------


@pytest.mark.parametrize("statement", [
    "UPDATE events SET state = state WHERE originator_version = 1",
    "DELETE FROM events WHERE originator_version = 3",
    "DELETE FROM checkpoints",
    "DELETE FROM checkpoint_heads",
])
async def test_the_app_role_cannot_edit_delete_or_drop_a_checkpoint(sealed: Sealed, statement: str) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_app(sealed.url, statement)
    assert await sealed.problems() == []


async def test_a_stream_forged_by_the_app_role_is_reported_inside_the_unsealed_window(sealed: Sealed) -> None:
    forged_stream(sealed.url)
    code, report = await sealed.verify()
    assert code == 0 and report["problems"] == []
    unsealed = report["digests"]["unsealed"]
    assert (unsealed["events"], unsealed["streams"], unsealed["new_streams"]) == (1, 1, 1)
    assert unsealed["seconds_since_newest_digest"] >= 0
    code, out, _ = await cli("replay", "verify-chain", "--database-url", sealed.url, "--digests",
                             str(sealed.digests), "--public-key", str(sealed.public))
    assert "unsealed window: 1 event in 1 stream (1 new) written after it" in out


async def test_a_stream_forged_by_the_app_role_with_an_old_transaction_id_is_reported(sealed: Sealed) -> None:
    oid = forged_stream(sealed.url, backdated=True)
    assert [(s, v) for s, v, _, _ in await sealed.problems()] == [(str(oid), 1)]


async def test_an_event_appended_past_a_sealed_head_by_the_app_role(sealed: Sealed) -> None:
    """Inside the window it is reported as unsealed; backdated, as added."""
    t = sealed.tasks[0]
    as_app(sealed.url, INSERT, appended_event(sealed.url, t))
    code, report = await sealed.verify()
    assert code == 0 and report["digests"]["unsealed"]["events"] == 1
    row = appended_event(sealed.url, t)
    as_app(sealed.url, INSERT.replace("hash)", "hash, transaction_id)").replace("%s)", "%s, %s)"), (*row, "3"))
    found = await sealed.problems()
    assert [(s, v) for s, v, _, _ in found] == [(str(t), row[1])]
    assert "beyond the head a digest sealed, yet written before the newest digest" in found[0][3]


# --- the seal itself --------------------------------------------------------------------------


async def test_seals_chain_and_a_failed_append_is_caught_up(sealed: Sealed, world: World) -> None:
    """A checkpoint whose publication failed is published before the next one: no gap."""
    async with await connect(sealed.url) as conn:
        from leasehold.persistence.checkpoints import write_checkpoint

        await write_checkpoint(conn)  # written, never published (as if the sink had failed)
    await three_finished_tasks(world)
    record = await sealed.seal()
    lines = [orjson.loads(x) for f in sorted(sealed.digests.glob("*.jsonl")) for x in f.read_bytes().splitlines()]
    assert [r["checkpoint_id"] for r in lines] == [1, 2, record["checkpoint_id"]] == [1, 2, 3]
    assert [r["prev_seal"] for r in lines[1:]] == [r["seal"] for r in lines[:-1]]
    assert lines[-1]["position"] is not None and lines[1]["position"] is None
    code, report = await sealed.verify()
    assert code == 0 and report["digests"]["records"] == 3 and report["digests"]["unsealed"]["events"] == 0


async def test_a_wrong_public_key_fails_every_record(sealed: Sealed, tmp_path: Path) -> None:
    generate_keypair(tmp_path / "other.pem", tmp_path / "other-public.pem")
    code, report = await cli_json("replay", "verify-chain", "--database-url", sealed.url, "--digests",
                                  str(sealed.digests), "--public-key", str(tmp_path / "other-public.pem"))
    assert code == 1 and "not with the given public key" in report["problems"][0]["problem"]


async def test_concurrent_sealers_publish_one_linear_chain(sealed: Sealed) -> None:
    import asyncio

    sealers = [Sealer(load_private_key(sealed.key), DirectorySink(sealed.digests)) for _ in range(4)]

    async def seal(s: Sealer) -> None:
        for _ in range(3):
            async with await connect(sealed.url) as conn:
                await s.seal(conn)

    await asyncio.gather(*(seal(s) for s in sealers))
    lines = [orjson.loads(x) for f in sorted(sealed.digests.glob("*.jsonl")) for x in f.read_bytes().splitlines()]
    assert [r["checkpoint_id"] for r in lines] == list(range(1, 14))
    code, report = await sealed.verify()
    assert code == 0 and report["digests"]["records"] == 13


# --- bundles ----------------------------------------------------------------------------------


async def test_a_bundle_with_a_removed_line_and_a_recomputed_manifest_fails_with_the_public_key(
        sealed: Sealed, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    code, _ = await cli_json("replay", "export", str(sealed.tasks[0]), str(out), "--database-url", sealed.url,
                             "--signing-key", str(sealed.key))
    assert code == 0 and (out / "manifest.sig").exists()
    code, report = await cli_json("replay", "verify-bundle", str(out), "--public-key", str(sealed.public))
    assert code == 0, report
    # Remove the last event and make the manifest say so, as someone without the key would.
    lines = (out / "events.jsonl").read_bytes().splitlines(keepends=True)[:-1]
    data = b"".join(lines)
    (out / "events.jsonl").write_bytes(data)
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    last = orjson.loads(lines[-1])
    manifest["files"]["events.jsonl"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                                         "lines": len(lines)}
    manifest["counts"]["events"] = len(lines)
    manifest["streams"][0].update(head_version=last["originator_version"], head_hash=last["hash"], events=len(lines))
    manifest["checkpoint"] = None
    (out / "manifest.json").write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    code, report = await cli_json("replay", "verify-bundle", str(out))
    assert code == 0, report  # without the key the recomputed manifest is consistent
    code, report = await cli_json("replay", "verify-bundle", str(out), "--public-key", str(sealed.public))
    assert code == 1
    assert report["problems"] == ["manifest.sig: the signature does not match manifest.json (the manifest was changed)"]
    (out / "manifest.sig").unlink()
    code, report = await cli_json("replay", "verify-bundle", str(out), "--public-key", str(sealed.public))
    assert code == 1 and "the manifest is not signed" in report["problems"][0]


async def test_a_periodic_seal_rests_when_another_process_just_sealed(sealed: Sealed) -> None:
    sealer = Sealer(load_private_key(sealed.key), DirectorySink(sealed.digests))
    async with await connect(sealed.url) as conn:
        first = await sealer.seal(conn)
        assert await sealer.seal(conn, unless_newer_than=60) == first  # the sink's last one is fresh
        second = await sealer.seal(conn, unless_newer_than=0)
    assert second["checkpoint_id"] == first["checkpoint_id"] + 1
    lines = [x for f in sealed.digests.glob("*.jsonl") for x in f.read_bytes().splitlines()]
    assert len(lines) == 3  # the fixture's seal, first, second
