"""Migration 0019 (scope pages) with data in it: a downgrade puts every paged scope back together
in its task's row, where the code before it reads the whole scope, and the upgrade after it works."""

from __future__ import annotations

import psycopg

from leasehold.migrations import runner as migrate
from support.core import World

SCOPE = {"targets": ["10.0.0.0/24"],
         "assets": [{"kind": "service", "value": f"10.0.0.{n % 250}:{1000 + n}/tcp"} for n in range(4_000)]}


async def test_a_downgrade_puts_every_paged_scope_back_together_in_its_row(world: World, database_url: str) -> None:
    paged = await world.task(scope=SCOPE)
    small = await world.task(scope={"targets": ["h"]})
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT cardinality(scope_pages) FROM worker_tasks WHERE id = %s", (paged,)).fetchone()
    assert row is not None and row[0] >= 2
    await world.services.db.pool.close()  # nothing may hold the tables while their columns go

    before = migrate.downgrade(database_url, "0019-1")  # the revision before it, whatever it is
    assert before is not None and before != "0019"
    with psycopg.connect(database_url) as conn:
        scopes = dict(conn.execute("SELECT id, scope FROM worker_tasks WHERE id = ANY(%s)", ([paged, small],)).fetchall())
    assert scopes == {paged: SCOPE, small: {"targets": ["h"]}}
    assert migrate.upgrade(database_url, "head") == migrate.head()
