"""The per-test databases: a migrated template per migration set, and copies of it for each test.

Template: ``leasehold_tmpl_<hash of migrations/versions>``, created once and migrated to head;
reused while the migrations are unchanged. Templates of other hashes are dropped (unless another
run used them within the last hour). Creation is serialised across concurrent pytest runs with
``pg_advisory_lock``; test databases orphaned by killed runs on this host are dropped.

Recycling: a test's migrated database is not dropped after the test but reset to the template's
state and handed to the next test of the same pytest process under a new name (see
:class:`TestDatabases`); a database whose schema or settings the test changed is dropped as before.

``tests/conftest.py`` turns these into the ``database_url``, ``make_database`` and
``empty_database_url`` fixtures.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import socket
import time
from typing import Any

import psycopg
from psycopg import sql

from leasehold.cli.embedded import with_database
from leasehold.migrations import runner as migrate

__all__ = ["TEMPLATE_PREFIX", "TEST_DB_PREFIX", "TestDatabases", "ensure_template", "migrations_hash",
           "schema_fingerprint"]

logger = logging.getLogger("tests.databases")

TEMPLATE_PREFIX = "leasehold_tmpl_"
TEST_DB_PREFIX = "t_"
#: pg_advisory_lock key serialising template (re)creation across concurrent pytest runs.
TEMPLATE_LOCK_KEY = 0x1EA5E401D_7E57
#: Templates of other migration hashes used this recently (seconds) are left alone.
STALE_TEMPLATE_GRACE_S = 3600
_HOST = socket.gethostname()
#: Set to 0 to drop every test database after its test (no recycling).
RECYCLE_ENV = "LEASEHOLD_TEST_RECYCLE"
#: A file each pytest process appends its counts to (created, recycled, dropped and why) at exit.
REPORT_ENV = "LEASEHOLD_TEST_DB_REPORT"
#: Objects created by a migration (or a test) have OIDs from here on; below are the system's own.
FIRST_USER_OID = 16384

#: Everything about a database's schema, settings and privileges that a test could change and a
#: reset does not restore: one md5. A recycled database must give the template's value.
SCHEMA_FINGERPRINT = """
SELECT md5(string_agg(x, E'\n' ORDER BY x)) FROM (
    SELECT format('class %s %s %s %s %s %s %s %s %s %s', c.oid, c.relname, c.relnamespace, c.relkind,
                  c.relpersistence, c.reloptions, c.relacl, c.relrowsecurity, c.relforcerowsecurity,
                  pg_get_expr(c.relpartbound, c.oid))
      FROM pg_class c WHERE c.oid >= 16384
    UNION ALL SELECT format('att %s %s %s %s %s %s %s %s %s', attrelid, attnum, attname, atttypid, atttypmod,
                            attnotnull, atthasdef, attisdropped, attoptions)
      FROM pg_attribute WHERE attrelid >= 16384
    UNION ALL SELECT format('def %s %s %s', adrelid, adnum, pg_get_expr(adbin, adrelid)) FROM pg_attrdef
    UNION ALL SELECT format('con %s %s %s %s', oid, conrelid, conname, pg_get_constraintdef(oid))
      FROM pg_constraint WHERE oid >= 16384
    UNION ALL SELECT format('idx %s', pg_get_indexdef(indexrelid)) FROM pg_index WHERE indexrelid >= 16384
    UNION ALL SELECT format('trg %s %s %s %s', tgrelid, tgname, tgenabled, tgfoid) FROM pg_trigger
    UNION ALL SELECT format('proc %s %s %s %s %s %s', oid, proname, md5(prosrc), proconfig, proacl, prosecdef)
      FROM pg_proc WHERE oid >= 16384
    UNION ALL SELECT format('ns %s %s %s %s', oid, nspname, nspowner, nspacl) FROM pg_namespace
      WHERE nspname !~ '^pg_(toast_)?temp_'
    UNION ALL SELECT format('rule %s %s %s', ev_class, rulename, md5(ev_action::text))
      FROM pg_rewrite WHERE oid >= 16384
    UNION ALL SELECT format('pol %s %s %s %s', polrelid, polname, polroles,
                            md5(coalesce(pg_get_expr(polqual, polrelid), '') || coalesce(pg_get_expr(polwithcheck, polrelid), '')))
      FROM pg_policy
    UNION ALL SELECT format('type %s %s %s', oid, typname, typacl) FROM pg_type WHERE oid >= 16384
    UNION ALL SELECT format('enum %s %s %s', enumtypid, enumsortorder, enumlabel) FROM pg_enum
    UNION ALL SELECT format('ext %s %s', extname, extversion) FROM pg_extension
    UNION ALL SELECT format('defacl %s %s %s', defaclrole, defaclnamespace, defaclacl) FROM pg_default_acl
    UNION ALL SELECT format('seq %s %s %s %s %s %s', seqrelid, seqtypid, seqstart, seqincrement, seqmax, seqcycle)
      FROM pg_sequence
    UNION ALL SELECT format('stx %s', oid) FROM pg_statistic_ext
    UNION ALL SELECT format('pub %s', oid) FROM pg_publication
    UNION ALL SELECT format('evt %s', oid) FROM pg_event_trigger
    UNION ALL SELECT format('lo %s', oid) FROM pg_largeobject_metadata
    UNION ALL SELECT format('desc %s %s %s %s', classoid, objoid, objsubid, md5(description))
      FROM pg_description WHERE objoid >= 16384
    UNION ALL SELECT format('set %s %s', setrole, setconfig) FROM pg_db_role_setting
      WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
    UNION ALL SELECT format('db %s %s %s', datacl, datconnlimit, datallowconn) FROM pg_database
      WHERE datname = current_database()
    UNION ALL SELECT format('prepared %s', gid) FROM pg_prepared_xacts WHERE database = current_database()
) AS s(x)
"""  # (16384: FIRST_USER_OID; the query has no parameters, its %s belong to format())

#: Per table, index, TOAST table, materialized view (and partitioned table or index, of size 0):
#: its size and the planner's statistics in ``pg_class``, and the table a reset truncates.
RELATION_STATE = """
SELECT c.oid::int8, pg_relation_size(c.oid), c.relpages, c.reltuples, c.relallvisible,
       coalesce(owner.oid, i.indrelid, CASE WHEN c.relkind IN ('i', 'I') THEN NULL ELSE c.oid END)::int8,
       c.relkind::text
  FROM pg_class c
  LEFT JOIN pg_index i ON i.indexrelid = c.oid
  LEFT JOIN pg_class owner ON owner.reltoastrelid = coalesce(i.indrelid, c.oid)
 WHERE c.oid >= %s AND c.relkind IN ('r', 'i', 't', 'm', 'p', 'I')
"""


def schema_fingerprint(conn: psycopg.Connection[Any]) -> str:
    """The :data:`SCHEMA_FINGERPRINT` of the database ``conn`` is connected to."""
    row = conn.execute(SCHEMA_FINGERPRINT).fetchone()
    return str(row[0]) if row else ""


class _FreshState:
    """What a fresh copy of the template looks like, beyond its schema: relations, sequences."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.schema = schema_fingerprint(conn)
        self.relations = _relations(conn)
        self.sequences = _sequences(conn)
        #: The tables that hold rows in the template (``alembic_version``), and a digest of them:
        #: an update in place changes no size, so their rows are compared.
        self.seeded = {oid: _table_digest(conn, oid) for oid, row in self.relations.items()
                       if row[5] == "r" and row[0] != 0}


def _table_digest(conn: psycopg.Connection[Any], table: int) -> str:
    [(name,)] = conn.execute("SELECT oid::regclass::text FROM pg_class WHERE oid = %s", (table,)).fetchall()
    # (the name as the catalog quotes it)
    query = sql.SQL("SELECT md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '')) FROM {} AS t")
    row = conn.execute(query.format(sql.SQL(name))).fetchone()
    return str(row[0]) if row else ""


def _relations(conn: psycopg.Connection[Any]) -> dict[int, tuple[Any, ...]]:
    return {row[0]: row[1:] for row in conn.execute(RELATION_STATE, (FIRST_USER_OID,)).fetchall()}


def _sequences(conn: psycopg.Connection[Any]) -> dict[int, Any]:
    rows = conn.execute("SELECT oid::int8, pg_sequence_last_value(oid) FROM pg_class WHERE relkind = 'S'"
                        " AND oid >= %s", (FIRST_USER_OID,)).fetchall()
    return dict(rows)


def migrations_hash() -> str:
    """Short hash of the contents (and names) of every file under ``migrations/versions``."""
    versions = migrate.MIGRATIONS_DIR / "versions"
    digest = hashlib.sha256()
    if versions.is_dir():
        for path in sorted(versions.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
                continue
            digest.update(path.relative_to(versions).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class NotRecyclable(Exception):
    """The test left its database in a state a reset does not undo; it is dropped instead."""


class TestDatabases:
    """Creates, recycles and drops the per-test databases on one server (autocommit admin connection).

    Each test gets a database of its own in the template's state. :meth:`checkout` hands out one
    that a previous test of this process used and :meth:`checkin` reset, else a new copy of the
    template; :meth:`checkin` resets it after its test, or drops it. A reset (as a superuser):

    * ends every session still connected to it (the test's leftovers), and waits until they have
      exited (their temporary tables go with them);
    * drops the partitions a fresh copy does not have (the Gateway adds the coming months' event
      partitions when it starts);
    * compares :data:`SCHEMA_FINGERPRINT` with a fresh copy's: a test that changed the schema,
      a privilege, a database setting or left a prepared transaction gets its database dropped;
    * truncates, in one ``TRUNCATE … CASCADE`` with ``session_replication_role = replica`` (the
      append-only triggers do not fire; only a superuser may set it, so only the tests can), every
      table whose size, or that of one of its indexes or its TOAST table, differs from a fresh
      copy's (a table empty in the template has a size of 0 until a row is written to it, and
      keeps its pages after a ``DELETE``); a table that holds rows in the template
      (``alembic_version``) cannot be restored so: when its rows or its size changed, the database
      is dropped;
    * puts back a fresh copy's planner statistics where the sizes are a fresh copy's (``TRUNCATE``
      gives its indexes ``relpages`` 0 and ``reltuples`` -1, where an index built on an empty
      table has 1 and 0; ``ANALYZE`` counts the template's own rows);
    * restarts the sequences that moved, deletes the statistics ``ANALYZE`` gathered, resets the
      database's cumulative statistics (``pg_stat_reset``);
    * checks that sizes, statistics and sequences now equal a fresh copy's (else: dropped);
    * renames the database: a process the test left behind cannot reach the next test's data.

    ``LEASEHOLD_TEST_RECYCLE=0`` drops every database after its test instead.

    Why: ``DROP DATABASE`` forces a checkpoint (every dirty page of every database on the server
    written and fsynced), and ``CREATE DATABASE`` writes the template's 450 files anew; the reset
    writes only the few tables the test filled.

    Without recycling, each test gets a database of its own: ``CREATE DATABASE … TEMPLATE`` writes the template's
    450 files anew, and ``DROP DATABASE`` first discards the database's pages, then forces a
    checkpoint. Both stay in the test's own setup and teardown, in that order, on purpose: a
    database that lives across a checkpoint has its 450 files fsynced. Making the next test's
    database ahead, or dropping behind in a thread, lets it live across the previous drop's
    checkpoint; measured on this box, a module of 123 short tests then took 316 s instead of 216 s.

    The per-test databases run with ``synchronous_commit = off``: a commit does not wait for its
    WAL flush (2–25 ms here, depending on the load). That changes nothing a test can see unless
    the server crashes, and the tests that crash a server (``owned_pg_server``, ``tests/replicas``)
    use servers of their own, with full durability.
    """

    __test__ = False  # not a test class

    def __init__(self, server_url: str, template: str, *, recycle: bool | None = None) -> None:
        self.server_url = server_url
        self.template = template
        self.tag = f"leasehold-test host={_HOST} pid={os.getpid()}"
        self._conn: psycopg.Connection[Any] | None = None
        self._idle: list[str] = []  # reset databases, each waiting for a test
        self._fresh: _FreshState | None = None
        if recycle is None:
            recycle = os.environ.get(RECYCLE_ENV, "1") != "0"
        self.recycle = recycle and bool(self.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
                                        [0][0])
        #: created, recycled, dropped (with the reason a database was not recycled)
        self.counts: dict[str, int] = {}

    def execute(self, query: sql.Composable | str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement on the maintenance database, reconnecting once if the server restarted."""
        for attempt in (1, 2):
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = psycopg.connect(self.server_url, autocommit=True)
            try:
                cur = self._conn.execute(query, params)
                return cur.fetchall() if cur.description else []
            except psycopg.OperationalError:
                if attempt == 2 or not (self._conn.closed or self._conn.broken):
                    raise
                self._conn = None
        raise AssertionError("unreachable")

    def create(self, *, migrated: bool = True) -> tuple[str, str]:
        """Create a fresh database (a copy of the template, or empty); return ``(name, url)``."""
        name = f"{TEST_DB_PREFIX}{secrets.token_hex(6)}"
        source = self.template if migrated else "template0"
        create = sql.SQL("CREATE DATABASE {} TEMPLATE {}")
        try:
            self.execute(create.format(sql.Identifier(name), sql.Identifier(source)))
        except psycopg.errors.InvalidCatalogName:
            if not migrated:
                raise
            # Another run (with other migrations) dropped our template: rebuild it, retry once.
            self.template = ensure_template(self.server_url)
            self.execute(create.format(sql.Identifier(name), sql.Identifier(self.template)))
        self.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(sql.Identifier(name), sql.Literal(self.tag))
        )
        self.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(sql.Identifier(name)))
        return name, with_database(self.server_url, name)

    def drop(self, name: str) -> None:
        """Drop a database, terminating any connection still open to it."""
        self.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def checkout(self) -> tuple[str, str]:
        """A migrated database in the template's state, ``(name, url)``: a reset one, else a new copy."""
        if self._idle:
            name = self._idle.pop()
            self._count("recycled")
            return name, with_database(self.server_url, name)
        name, url = self.create()
        self._count("created")
        if self.recycle and self._fresh is None:
            with psycopg.connect(url, autocommit=True) as conn:
                self._fresh = _FreshState(conn)
        return name, url

    def checkin(self, name: str) -> None:
        """After its test: reset the database for the next test (:meth:`checkout`), or drop it."""
        if self.recycle and self._fresh is not None:
            try:
                self._idle.append(self._reset(name, self._fresh))
                return
            except (NotRecyclable, psycopg.Error) as exc:
                logger.info("test database %s not recycled: %s", name, exc)
                self._count(f"dropped: {type(exc).__name__}")
        self.drop(name)

    def _reset(self, name: str, fresh: _FreshState) -> str:
        """Bring database ``name`` back to ``fresh``; return its new name."""
        self.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"
                     " AND pid <> pg_backend_pid()", (name,))
        # Until they are gone: a session's temporary tables are dropped when it exits.
        deadline = time.monotonic() + 10
        while self.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,))[0][0]:
            if time.monotonic() > deadline:
                raise NotRecyclable("sessions still connected 10 s after they were terminated")
            time.sleep(0.01)  # polling the server for the exit of the sessions it was told to end
        with psycopg.connect(with_database(self.server_url, name), autocommit=True) as conn:
            conn.execute("SET lock_timeout = '10s'")  # behind a terminated session's locks, briefly
            added = [row[0] for row in conn.execute(
                "SELECT c.oid::regclass::text FROM pg_class c WHERE c.relispartition AND c.relkind IN ('r', 'p')"
                " AND c.oid >= %s"
                " AND NOT c.oid = ANY(%s) ORDER BY c.oid", (FIRST_USER_OID, sorted(fresh.relations)))]
            if added:  # the Gateway adds the coming months' event partitions when it starts
                conn.execute("SET session_replication_role = replica")
                # (the names as the catalog quotes them)
                conn.execute(sql.SQL("DROP TABLE {}").format(sql.SQL(", ").join(map(sql.SQL, added))))
                conn.execute("RESET session_replication_role")
            if schema_fingerprint(conn) != fresh.schema:
                raise NotRecyclable("its schema, settings or privileges changed")
            for table, digest in fresh.seeded.items():
                if _table_digest(conn, table) != digest:
                    raise NotRecyclable(f"the rows of table {table}, which the template fills, changed")
            relations = _relations(conn)
            # Tables to truncate: those with a relation whose size moved (a relation as large as in a
            # fresh copy holds what it holds there: nothing, or the template's rows compared above);
            # statistics alone are put back below.
            tables = {row[4] for oid, row in relations.items() if row[0] != fresh.relations.get(oid, row)[0]}
            if tables:
                for table in tables:
                    owner = fresh.relations.get(table)
                    if owner is None or owner[5] != "r" or owner[0] != 0:
                        raise NotRecyclable(f"relation {table} cannot be restored by TRUNCATE")
                conn.execute("SET session_replication_role = replica")
                names = [row[0] for row in conn.execute(
                    "SELECT oid::regclass::text FROM pg_class WHERE oid = ANY(%s) ORDER BY 1", (sorted(tables),))]
                # (the names as the catalog quotes them)
                conn.execute(sql.SQL("TRUNCATE {} CASCADE").format(sql.SQL(", ").join(map(sql.SQL, names))))
                conn.execute("RESET session_replication_role")
            # TRUNCATE leaves its indexes with relpages 0 and reltuples -1 where a fresh copy's, built
            # on empty tables, say 1 and 0; ANALYZE counts the template's own rows: the planner reads
            # these, so a fresh copy's are put back.
            for oid, row in _relations(conn).items():
                want = fresh.relations.get(oid)
                if want is not None and row[0] == want[0] and row[1:4] != want[1:4]:
                    conn.execute("UPDATE pg_class SET relpages = %s, reltuples = %s, relallvisible = %s"
                                 " WHERE oid = %s", (*want[1:4], oid))
            for oid, last in _sequences(conn).items():
                if last != fresh.sequences.get(oid):
                    conn.execute("SELECT setval(seqrelid::regclass, seqstart, false) FROM pg_sequence"
                                 " WHERE seqrelid = %s", (oid,))
            conn.execute("DELETE FROM pg_statistic WHERE starelid >= %s", (FIRST_USER_OID,))
            conn.execute("DELETE FROM pg_statistic_ext_data")
            conn.execute("SELECT pg_stat_reset()")
            after, sequences = _relations(conn), _sequences(conn)
            if after != fresh.relations or sequences != fresh.sequences:
                differ = sorted(f"{oid}: {after.get(oid)} (fresh: {fresh.relations.get(oid)})"
                                for oid in after.keys() | fresh.relations.keys()
                                if after.get(oid) != fresh.relations.get(oid))
                raise NotRecyclable(f"the reset did not restore a fresh copy's sizes, statistics or "
                                    f"sequences: {differ[:3]} {sequences}")
        new_name = f"{TEST_DB_PREFIX}{secrets.token_hex(6)}"
        self.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(name), sql.Identifier(new_name)))
        return new_name

    def drop_orphans(self) -> None:
        """Drop test databases left behind by dead pytest processes on this host."""
        rows = self.execute(
            "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database WHERE datname LIKE %s",
            (TEST_DB_PREFIX.replace("_", r"\_") + "%",),
        )
        prefix = f"leasehold-test host={_HOST} pid="
        for name, comment in rows:
            if comment and comment.startswith(prefix):
                pid = comment[len(prefix) :]
                if pid.isdigit() and not _pid_alive(int(pid)):
                    logger.info("dropping orphaned test database %s (%s)", name, comment)
                    self.drop(name)

    def close(self) -> None:
        """Drop the databases waiting for a test; close the admin connection."""
        logger.info("test databases of this process: %s", self.counts)
        report = os.environ.get(REPORT_ENV)
        if report:  # one line per pytest process: how many were created, recycled, dropped and why
            with open(report, "a", encoding="utf-8") as out:
                out.write(json.dumps({"pid": os.getpid(), **self.counts}) + "\n")
        while self._idle:
            self.drop(self._idle.pop())
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _drop_database(conn: psycopg.Connection[Any], name: str) -> None:
    ident = sql.Identifier(name)
    conn.execute(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE false").format(ident))
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


def ensure_template(server_url: str) -> str:
    """Create (or reuse) the migrated template database for the current migrations; return its name.

    Templates of other migration hashes are dropped unless another run used them within
    :data:`STALE_TEMPLATE_GRACE_S` (so concurrent runs from other checkouts keep theirs).
    """
    name = f"{TEMPLATE_PREFIX}{migrations_hash()}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (TEMPLATE_LOCK_KEY,))
        try:
            rows = conn.execute(
                """SELECT datname, coalesce(substring(shobj_description(oid, 'pg_database')
                                                      FROM 'last-used=([0-9.]+)')::float8, 0)
                                   < extract(epoch FROM now()) - %s
                   FROM pg_database WHERE datname LIKE %s""",
                (STALE_TEMPLATE_GRACE_S, TEMPLATE_PREFIX.replace("_", r"\_") + "%"),
            ).fetchall()
            existing = {row[0] for row in rows}
            for other, unused in sorted(rows):
                if other != name and (unused or other.endswith("_building")):
                    logger.info("dropping stale template database %s", other)
                    _drop_database(conn, other)
            if name not in existing:
                started = time.perf_counter()
                building = f"{name}_building"
                conn.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(building))
                )
                migrate.upgrade(with_database(server_url, building), "head")
                conn.execute(
                    sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                        sql.Identifier(building), sql.Identifier(name)
                    )
                )
                conn.execute(
                    sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false").format(
                        sql.Identifier(name)
                    )
                )
                logger.info("created template database %s in %.2fs", name, time.perf_counter() - started)
            (now,) = conn.execute("SELECT extract(epoch FROM now())::text").fetchone() or ("0",)
            conn.execute(
                sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                    sql.Identifier(name), sql.Literal(f"leasehold test template last-used={now}")
                )
            )
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (TEMPLATE_LOCK_KEY,))
    return name
