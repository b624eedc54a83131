"""The time-partitioned event log: a lifecycle across a partition boundary, partitions created
ahead (and the default partition when none covers now), append-only on every partition, and
retention end to end (archive, verify, drop; verify-chain and timeline over archive + live)."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import orjson
import psycopg
import pytest
from psycopg import sql
from replay_support import cli, cli_json

from leasehold.domain.results import payload_sha256
from leasehold.persistence.checkpoints import write_checkpoint
from leasehold.persistence.connection import connect
from leasehold.persistence.partitions import ensure_partitions, list_partitions
from leasehold.persistence.seals import generate_keypair, load_private_key
from leasehold.persistence.snapshot import snapshot
from leasehold.replay import retention
from leasehold.replay.archive import ArchiveSet, export_archive, verify_archive
from support.core import World
from support.waits import wait_until, wait_until_sync


def _db_now(url: str) -> datetime:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]


def split_log_at(url: str, seconds_ahead: float) -> datetime:
    """Make a partition boundary ``seconds_ahead`` from now: the first partition ends there and a
    new one (through ``events_create_partition``) starts there. Returns the boundary."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT clock_timestamp() + make_interval(secs => %s)", (seconds_ahead,)).fetchone()
        assert row is not None
        boundary: datetime = row[0]
        with conn.transaction():
            conn.execute("ALTER TABLE events DETACH PARTITION events_p_initial")
            conn.execute(sql.SQL("ALTER TABLE events ATTACH PARTITION events_p_initial"
                                 " FOR VALUES FROM (MINVALUE) TO ({})").format(sql.Literal(boundary)))
            conn.execute("SELECT events_create_partition(%s, %s + interval '1 day')", (boundary, boundary))
    return boundary


def wait_until_past(url: str, moment: datetime, *, deadline: float = 10.0) -> None:
    """Poll the database clock until it is past ``moment``."""
    wait_until_sync(lambda: _db_now(url) > moment, deadline, what=f"the database clock to pass {moment}")


def partitions_of(url: str, stream: UUID) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tableoid::regclass::text, count(*) FROM events WHERE originator_id = %s"
                            " GROUP BY 1", (stream,)).fetchall()
    return {r[0]: r[1] for r in rows}


async def first_half(world: World) -> Any:
    worker = await world.worker()
    a = await world.running(worker)
    return worker, a


async def second_half(world: World, worker: Any, a: Any) -> None:
    records = [{"type": "asset", "value": "a.example", "n": 1}]
    await world.lifecycle.submit_batch(worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=1,
                                       idempotency_key="one", payload_sha256=payload_sha256(records),
                                       records=records, final=False)
    await world.final_batch(worker, a, sequence=2, key="last")
    await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)


async def test_a_lifecycle_across_a_partition_boundary_verifies_and_rebuilds(world: World, database_url: str) -> None:
    boundary = split_log_at(database_url, 1.5)
    worker, a = await first_half(world)
    async with await connect(database_url) as conn:
        await write_checkpoint(conn)
    wait_until_past(database_url, boundary)
    await second_half(world, worker, a)
    async with await connect(database_url) as conn:
        await write_checkpoint(conn)

    spread = partitions_of(database_url, a.task.id)
    assert set(spread) == {"events_p_initial", "events_p" + boundary.strftime("%Y%m%d")
                           + "t" + _utc_hms(boundary)}, spread
    code, report = await cli_json("replay", "verify-chain", "--database-url", database_url)
    assert code == 0 and report["ok"], report["problems"]
    code, report = await cli_json("replay", "verify", "--database-url", database_url)
    assert code == 0 and report["ok"], report


def _utc_hms(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%H%M%S")


async def test_a_duplicate_version_is_refused_within_a_partition(world: World, database_url: str) -> None:
    worker, a = await first_half(world)
    with psycopg.connect(database_url) as conn, pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash)"
                     " SELECT originator_id, originator_version, topic, state, prev_hash, hash FROM events"
                     " WHERE originator_id = %s AND originator_version = 1", (a.task.id,))


async def test_every_partition_is_append_only_and_closed_to_the_application(database_url: str) -> None:
    async with await connect(database_url) as conn:
        await ensure_partitions(conn, span="1 month", ahead="3 months")
        names = [p.name for p in await list_partitions(conn)]
    assert len(names) >= 4 and "events_p_default" in names
    with psycopg.connect(database_url, autocommit=True) as conn:
        for at in ("clock_timestamp()", "clock_timestamp() + interval '40 days'", "'infinity'"):
            conn.execute(sql.SQL("INSERT INTO events (originator_id, originator_version, topic, state, prev_hash,"
                                 " hash, recorded_at) VALUES (gen_random_uuid(), 1, 'x', '\\x00', %s, %s, {})"
                                 ).format(sql.SQL(at)), (bytes(32), bytes(32)))
        filled = {r[0] for r in conn.execute("SELECT DISTINCT tableoid::regclass::text FROM events").fetchall()}
        assert len(filled) == 3 and "events_p_default" in filled  # a new partition among them
        for name in names:
            triggers = {r[0] for r in conn.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass", (name,)).fetchall()}
            assert {"events_no_update", "events_no_delete", "events_no_truncate"} <= triggers, name
            for statement in ("UPDATE {} SET topic = 'y'", "DELETE FROM {}", "TRUNCATE {}"):
                if name not in filled and not statement.startswith("TRUNCATE"):
                    continue  # a row trigger fires on rows: the catalog check above covers it
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                    conn.execute(sql.SQL(statement).format(sql.Identifier(name)))
        for statement in ("UPDATE events SET topic = 'y'", "DELETE FROM events", "TRUNCATE events"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                conn.execute(statement)
        conn.execute("SET ROLE leasehold_app")
        for name in names:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied|must be owner"):
                conn.execute(sql.SQL("SELECT 1 FROM {}").format(sql.Identifier(name)))
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must be owner"):
                conn.execute(sql.SQL("ALTER TABLE events DETACH PARTITION {}").format(sql.Identifier(name)))
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must be owner"):
                conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            conn.execute("SELECT events_create_partition(now() + interval '10 years', now() + interval '11 years')")
        conn.execute("RESET ROLE")


async def test_an_append_with_no_partition_for_now_lands_in_the_default_one(world: World, database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn, conn.transaction():
        conn.execute("ALTER TABLE events DETACH PARTITION events_p_initial")
        conn.execute("ALTER TABLE events ATTACH PARTITION events_p_initial FOR VALUES FROM (MINVALUE)"
                     " TO (clock_timestamp())")
    worker, a = await first_half(world)
    assert set(partitions_of(database_url, a.task.id)) == {"events_p_default"}
    async with await connect(database_url) as conn:
        created = await ensure_partitions(conn, span="1 day", ahead="2 days")
    assert len(created) >= 2
    await second_half(world, worker, a)
    assert set(partitions_of(database_url, a.task.id)) == {"events_p_default", created[0]}
    code, report = await cli_json("replay", "verify-chain", "--database-url", database_url)
    assert code == 0 and report["ok"], report["problems"]


# --- retention --------------------------------------------------------------------------------


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    private, public = tmp_path / "keys" / "seal-key.pem", tmp_path / "keys" / "seal-public.pem"
    private.parent.mkdir()
    generate_keypair(private, public)
    return private, public


async def _archived_lifecycle(world: World, database_url: str) -> tuple[Any, datetime]:
    """A lifecycle whose first half is in the first partition, checkpointed there, and whose
    second half is in the next one; returns (the attempt, the boundary)."""
    boundary = split_log_at(database_url, 1.5)
    worker, a = await first_half(world)
    async with await connect(database_url) as conn:
        await write_checkpoint(conn)
    wait_until_past(database_url, boundary)
    await second_half(world, worker, a)
    return a, boundary


async def test_retention_end_to_end(world: World, database_url: str, tmp_path: Path,
                                    keys: tuple[Path, Path]) -> None:
    a, _ = await _archived_lifecycle(world, database_url)
    digests = tmp_path / "digests"
    code, out_, err = await cli("seal", "now", "--signing-key", str(keys[0]), "--digest-dir", str(digests),
                                "--database-url", database_url)
    assert code == 0, err
    code, before = await cli_json("replay", "timeline", str(a.task.id), "--database-url", database_url)
    assert code == 0
    code, scan_before = await cli_json("replay", "timeline", "--scan", str(world.scan), "--database-url", database_url)
    assert code == 0
    out = tmp_path / "archives"

    code, dry = await cli_json("retention", "run", "--older-than", "0s", "--out", str(out),
                               "--database-url", database_url)
    assert code == 0 and dry["dry_run"] and [p["partition"] for p in dry["partitions"]] == ["events_p_initial"]
    assert not out.exists()

    code, done = await cli_json("retention", "run", "--older-than", "0s", "--out", str(out), "--execute",
                                "--signing-key", str(keys[0]), "--database-url", database_url)
    assert code == 0, done
    (entry,) = done["partitions"]
    assert entry["action"] == "archived" and entry["events"] > 0
    archive = out / "events_p_initial"
    async with await connect(database_url) as conn:
        assert "events_p_initial" not in [p.name for p in await list_partitions(conn)]
        cur = await conn.execute("SELECT manifest_sha256, events FROM event_archives")
        assert await cur.fetchall() == [(entry["manifest_sha256"], entry["events"])]
    assert hashlib.sha256((archive / "manifest.json").read_bytes()).hexdigest() == entry["manifest_sha256"]

    # The live log alone no longer verifies: the archived partition is missing.
    code, report = await cli_json("replay", "verify-chain", "--database-url", database_url)
    assert code == 1 and any("give that archive" in p["problem"] for p in report["problems"])
    # With the archive (and its signature checked), chains, checkpoints and signed seals verify.
    code, report = await cli_json("replay", "verify-chain", "--archive", str(archive), "--public-key", str(keys[1]),
                                  "--digests", str(digests), "--database-url", database_url)
    assert code == 0 and report["ok"], report["problems"]
    assert report["archived_events"] == entry["events"]
    # The task's timeline is whole again with the archive.
    code, after = await cli_json("replay", "timeline", str(a.task.id), "--archive", str(archive),
                                 "--database-url", database_url)
    assert code == 0 and after["events"] == before["events"]
    code, scan_after = await cli_json("replay", "timeline", "--scan", str(world.scan), "--archive", str(archive),
                                      "--database-url", database_url)
    assert code == 0 and scan_after["events"] == scan_before["events"]
    code, _, err = await cli("replay", "timeline", str(a.task.id), "--database-url", database_url)
    assert code == 1 and "were archived and are in no archive given" in err
    code, _, err = await cli("replay", "verify", "--database-url", database_url)
    assert "1 partition of the log was archived" in err and "reads the live log only" in err
    code, report = await cli_json("replay", "verify-bundle", str(archive), "--public-key", str(keys[1]))
    assert code == 0 and report["ok"], report

    # Tampering with the archive is caught: an edited event with the manifest's digests fixed
    # breaks the signature and the chain.
    lines = [orjson.loads(x) for x in (archive / "events.jsonl").read_bytes().splitlines()]
    lines[-1]["state"]["timestamp"] = "2000-01-01T00:00:00+00:00"
    data = b"".join(orjson.dumps(x) + b"\n" for x in lines)
    (archive / "events.jsonl").write_bytes(data)
    manifest = orjson.loads((archive / "manifest.json").read_bytes())
    manifest["files"]["events.jsonl"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                                         "lines": len(lines)}
    (archive / "manifest.json").write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    code, report = await cli_json("replay", "verify-chain", "--archive", str(archive), "--public-key", str(keys[1]),
                                  "--database-url", database_url)
    messages = " ".join(p["problem"] for p in report["problems"])
    assert code == 1 and "signature does not match" in messages and "edited" in messages
    check = verify_archive(archive)
    assert any("edited" in p for p in check.problems)


async def test_an_archive_that_does_not_verify_leaves_the_partition(world: World, database_url: str, tmp_path: Path,
                                                                   keys: tuple[Path, Path],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    await _archived_lifecycle(world, database_url)
    real = retention.export_archive

    async def export_then_tamper(conn: Any, partition: Any, out: Path, key: Any) -> Any:
        written = await real(conn, partition, out, key)
        events = out / "events.jsonl"
        events.write_bytes(events.read_bytes().replace(b'"originator_version":2', b'"originator_version":3', 1))
        return written

    monkeypatch.setattr(retention, "export_archive", export_then_tamper)
    async with await connect(database_url) as conn:
        (due,) = await retention.due_partitions(conn, timedelta(0))
        with pytest.raises(retention.ArchiveFailed, match="does not verify"):
            await retention.archive_partition(conn, due, tmp_path / "a", load_private_key(keys[0]))
        assert due.name in [p.name for p in await list_partitions(conn)]
        cur = await conn.execute("SELECT count(*) FROM event_archives")
        assert await cur.fetchone() == (0,)
    code, report = await cli_json("replay", "verify-chain", "--database-url", database_url)
    assert code == 0 and report["ok"], report["problems"]


async def test_a_partition_that_changed_after_it_was_archived_is_not_dropped(
        world: World, database_url: str, tmp_path: Path, keys: tuple[Path, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An append recorded inside the partition's range whose transaction commits only after the
    archive was written and verified (a command that began before the boundary) makes the
    partition differ from its archive: the drop refuses (PartitionChanged, under the detach's
    lock), and the partition, with the late event, stays; nothing is registered."""
    boundary = split_log_at(database_url, 1.5)
    worker, a = await first_half(world)
    late_stream = uuid4()
    async with await psycopg.AsyncConnection.connect(database_url) as late:
        await late.execute(
            "INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash, recorded_at)"
            " VALUES (%s, 1, 'late', '\\x00', %s, %s, %s)",
            (late_stream, bytes(32), bytes(32), boundary - timedelta(seconds=1)))  # open, not yet committed
        wait_until_past(database_url, boundary)
        await second_half(world, worker, a)
        real_drop = retention.drop_archived

        async def commit_late_then_drop(*args: Any) -> Any:
            await late.commit()  # the archive is written and verified; the partition changes now
            return await real_drop(*args)

        monkeypatch.setattr(retention, "drop_archived", commit_late_then_drop)
        async with await connect(database_url) as conn:
            (due,) = await retention.due_partitions(conn, timedelta(0))
            with pytest.raises(retention.ArchiveFailed, match="nothing dropped"):
                await retention.archive_partition(conn, due, tmp_path / "a", load_private_key(keys[0]))
            assert due.name in [p.name for p in await list_partitions(conn)]
            cur = await conn.execute("SELECT count(*) FROM event_archives")
            assert await cur.fetchone() == (0,)
    assert partitions_of(database_url, late_stream) == {due.name: 1}
    assert sum(partitions_of(database_url, a.task.id).values()) > 0


async def test_archives_must_join_up(world: World, database_url: str, tmp_path: Path, keys: tuple[Path, Path]) -> None:
    """An archive given without the register knowing it, or a stream whose earlier part is in
    no archive given, is a finding."""
    a, _ = await _archived_lifecycle(world, database_url)
    async with await connect(database_url) as conn:
        (due,) = await retention.due_partitions(conn, timedelta(0))
        async with snapshot(conn):
            await export_archive(conn, due, tmp_path / "unregistered", load_private_key(keys[0]))
    joined = ArchiveSet.load([tmp_path / "unregistered"], public_key=load_private_key(keys[0]).public_key())
    assert joined.problems == [] and joined.tails[a.task.id][0] >= 1
    code, report = await cli_json("replay", "verify-chain", "--archive", str(tmp_path / "unregistered"),
                                  "--database-url", database_url)
    assert code == 1 and any("not in the log's register" in p["problem"] for p in report["problems"])


async def test_the_gateway_creates_partitions_ahead(database_url: str, pki: Any) -> None:
    from support.gateway import running_gateway

    async with running_gateway(database_url, pki, partition_span="1 day", partition_ahead="5 days"):
        async with await connect(database_url, autocommit=True) as conn:
            async def covered() -> bool:
                cur = await conn.execute("SELECT max(upper_bound) >= now() + interval '5 days' FROM event_partitions"
                                         " WHERE NOT is_default")
                return (await cur.fetchone()) == (True,)

            await wait_until(covered, 20, what="the Gateway to create the partitions ahead", interval=0.1)


async def test_the_partitions_commands(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEASEHOLD_SEAL_KEY_FILE", raising=False)
    code, created = await cli_json("partitions", "ensure", "--span", "7 days", "--ahead", "70 days",
                                   "--database-url", database_url)
    assert code == 0 and len(created["created"]) >= 1
    code, again = await cli_json("partitions", "ensure", "--span", "7 days", "--ahead", "70 days",
                                 "--database-url", database_url)
    assert code == 0 and again["created"] == []
    code, listed = await cli_json("partitions", "list", "--database-url", database_url)
    names = [p["name"] for p in listed]
    assert code == 0 and names[0] == "events_p_initial" and names[-1] == "events_p_default"
    assert set(created["created"]) <= set(names)
    code, out, err = await cli("partitions", "ensure", "--span", "-1 days", "--database-url", database_url)
    assert code == 2 and "span must be positive" in err
    code, out, err = await cli("retention", "run", "--older-than", "soon", "--out", "x", "--database-url", database_url)
    assert code == 2 and "90d" in err
    code, out, err = await cli("retention", "run", "--older-than", "0s", "--out", "x", "--execute",
                               "--database-url", database_url)
    assert code == 2 and "--signing-key" in err


async def test_retention_gives_up_rather_than_stall_the_log(world: World, database_url: str, tmp_path: Path,
                                                           keys: tuple[Path, Path],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader holding the log (a long audit) keeps the detach from getting its lock: retention
    gives up after its lock timeout (so appends never wait long behind it) and keeps the partition."""
    import leasehold.persistence.partitions as partitions

    await _archived_lifecycle(world, database_url)
    monkeypatch.setattr(partitions, "LOCK_TIMEOUT_MS", 300)
    async with await connect(database_url) as reader, await connect(database_url) as conn:
        async with reader.transaction():
            await reader.execute("SELECT count(*) FROM events")  # holds ACCESS SHARE on the log
            (due,) = await retention.due_partitions(conn, timedelta(0))
            with pytest.raises(retention.ArchiveFailed, match="could not lock"):
                await retention.archive_partition(conn, due, tmp_path / "a", load_private_key(keys[0]))
        assert due.name in [p.name for p in await list_partitions(conn)]
        cur = await conn.execute("SELECT count(*) FROM event_archives")
        assert await cur.fetchone() == (0,)


async def test_racing_writes_across_a_boundary_never_fork_a_stream(world: World, database_url: str) -> None:
    """No key spans partitions, so the stream's row lock is what keeps its versions unique: ten
    renewals raced on one task on both sides of a boundary leave versions 1..n, each once, in a
    chain that verifies."""
    boundary = split_log_at(database_url, 1.5)
    worker, a = await first_half(world)

    async def race() -> None:
        await asyncio.gather(*(world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
                               for _ in range(10)))

    await race()
    wait_until_past(database_url, boundary)
    await race()
    assert len(partitions_of(database_url, a.task.id)) == 2
    with psycopg.connect(database_url) as conn:
        versions = [r[0] for r in conn.execute("SELECT originator_version FROM events WHERE originator_id = %s"
                                               " ORDER BY 1", (a.task.id,)).fetchall()]
    assert versions == list(range(1, len(versions) + 1)) and len(versions) >= 20
    code, report = await cli_json("replay", "verify-chain", "--database-url", database_url)
    assert code == 0 and report["ok"], report["problems"]
