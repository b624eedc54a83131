"""The module-private server survives an immediate restart with its committed data."""

import psycopg


def test_owned_server_keeps_committed_rows_across_immediate_restart(owned_pg_server):
    url = owned_pg_server.database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (name text)")
        conn.execute("INSERT INTO kept VALUES ('kept')")
    owned_pg_server.restart("immediate")
    with psycopg.connect(url) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM kept")]
    assert names == ["kept"]
