"""``replay rebuild --schema``: the whole log rebuilt into a fresh schema equals the live projections
(invariant 1, row for row), and the command refuses to clobber anything it did not make."""

from __future__ import annotations

import psycopg
from replay_support import cli, cli_json, random_workload

from support.core import World


async def test_rebuild_into_a_fresh_schema_equals_the_live_projections(world: World, database_url: str) -> None:
    await random_workload(world, seed=23, rounds=8)
    code, report = await cli_json("replay", "rebuild", "--schema", "audit_copy", "--database-url", database_url)
    assert code == 0, report
    with psycopg.connect(database_url) as conn:
        for table, rows in report["rows"].items():
            live = conn.execute(f"SELECT count(*) FROM public.{table}").fetchone()  # noqa: S608
            assert live == (rows,), table
        comment = conn.execute("SELECT obj_description('audit_copy'::regnamespace, 'pg_namespace')").fetchone()
        assert comment is not None and comment[0].startswith(f"leasehold replay rebuild: {report['events']} events")
        keys = conn.execute("SELECT count(*) FROM pg_constraint WHERE contype = 'p'"
                            " AND connamespace = 'audit_copy'::regnamespace").fetchone()
        assert keys == (len(report["rows"]),)
    # The rebuilt schema, compared with a second rebuild row by row, has no difference.
    code, verified = await cli_json("replay", "verify", "--schema", "audit_copy", "--database-url", database_url)
    assert (code, verified["differences"]) == (0, [])
    # And nothing in public differs from the rebuilt copy either (EXCEPT both ways, all columns).
    with psycopg.connect(database_url) as conn:
        for table in report["rows"]:
            for a, b in (("public", "audit_copy"), ("audit_copy", "public")):
                extra = conn.execute(f"SELECT count(*) FROM (SELECT * FROM {a}.{table}"  # noqa: S608
                                     f" EXCEPT SELECT * FROM {b}.{table}) d").fetchone()
                assert extra == (0,), (table, a, b)


async def test_rebuild_refuses_public_existing_and_foreign_schemas(world: World, database_url: str) -> None:
    await world.task()
    url = ("--database-url", database_url)
    code, _, err = await cli("replay", "rebuild", "--schema", "public", *url)
    assert code == 2 and "refusing to rebuild into 'public'" in err
    code, _, err = await cli("replay", "rebuild", "--schema", "Bad-Name", *url)
    assert code == 2 and "must match" in err

    assert (await cli("replay", "rebuild", "--schema", "shadow", *url))[0] == 0
    code, _, err = await cli("replay", "rebuild", "--schema", "shadow", *url)
    assert code == 1 and "already exists" in err and "--replace" in err
    await world.task()
    code, out, _ = await cli("replay", "rebuild", "--schema", "shadow", "--replace", *url)
    assert code == 0 and "worker_tasks: 2 rows" in out

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA precious; CREATE TABLE precious.notes (x int)")
    code, _, err = await cli("replay", "rebuild", "--schema", "precious", "--replace", *url)
    assert code == 1 and "was not made by replay rebuild" in err
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM precious.notes").fetchone() == (0,)
