"""Nothing on the Gateway's path keeps state in a database session, so it runs behind a
transaction-pooling proxy (``tests/servers/test_pgbouncer.py`` proves it against a real
PgBouncer; this guards the rule for the statements that test does not reach).

Refused in every named statement and every SQL string of the Gateway's packages: a session
``SET`` (``SET LOCAL`` and ``SET TRANSACTION`` are the transaction's own), ``set_config(…,
false)``, session-level advisory locks (the ``_xact_`` ones end with the transaction), temporary
tables, ``LISTEN``/``UNLISTEN`` (the one listening connection, ``persistence/listening.py``,
goes to ``--notify-database-url``) and ``PREPARE``/``DEALLOCATE`` statements.
"""

from __future__ import annotations

import re
from pathlib import Path

from leasehold.persistence.queries import QUERIES

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "persistence", "projections", "domain")
#: The one place that may LISTEN: a connection of its own, never a pooled one.
LISTENING = ROOT / "persistence" / "listening.py"

#: What only a session keeps. The statements are written in upper case, and checked where a
#: statement starts (a named statement, an SQL string): an UPDATE's "SET col = …" is no session SET.
SESSION_STATE = re.compile(
    r"(?-i:\A\s*(?:SET\s+(?!LOCAL\b|TRANSACTION\b)|(?:UN)?LISTEN\s|PREPARE\s|DEALLOCATE\s))"
    r"|set_config\s*\([^)]*,\s*false\s*\)"
    r"|pg_(?:try_)?advisory_(?!xact_)\w*lock\w*\s*\("
    r"|\bCREATE\s+(?:GLOBAL\s+|LOCAL\s+)?TEMP(?:ORARY)?\s+TABLE\b",
    re.IGNORECASE,
)
#: A Python string literal's text: triple-quoted, or on one line.
STRING = re.compile(r"(?s)(\"{3}|'{3})(.*?)\1" + r'|"((?:[^"\\\n]|\\.)*)"' + r"|'((?:[^'\\\n]|\\.)*)'")


def _without_comments(statement: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in statement.splitlines())


def test_no_named_statement_keeps_session_state() -> None:
    offending = {name: found.group(0) for name, statement in QUERIES.items()
                 if (found := SESSION_STATE.search(_without_comments(statement)))}
    assert len(QUERIES) > 50
    assert offending == {}


def _sql_strings(path: Path) -> list[tuple[int, str]]:
    text = path.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(2) or m.group(3) or m.group(4) or "")
            for m in STRING.finditer(text)]


def test_no_sql_string_in_the_gateway_packages_keeps_session_state() -> None:
    offending = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, literal in _sql_strings(path):
                found = SESSION_STATE.search(literal)
                if found is None or (path == LISTENING and re.match(r"\s*LISTEN\b", literal)):
                    continue
                offending.append(f"{path.relative_to(ROOT)}:{line}: {literal!r}")
    assert offending == []


def test_the_guard_finds_what_it_refuses() -> None:
    for statement in ("SET statement_timeout = 0", "SET search_path TO x", "SET SESSION statement_timeout = 0", "SELECT pg_advisory_lock(1)",
                      "SELECT pg_try_advisory_lock(1)", "CREATE TEMP TABLE t (x int)",
                      "CREATE TEMPORARY TABLE t (x int)", "LISTEN leasehold", "SELECT set_config('a', 'b', false)",
                      "PREPARE p AS SELECT 1"):
        assert SESSION_STATE.search(statement), statement
    for statement in ("SET LOCAL lock_timeout = 10", "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                      "SELECT pg_advisory_xact_lock(1)", "SELECT set_config('plan_cache_mode', 'x', true)",
                      "SELECT pg_notify('leasehold', 'x')"):
        assert not SESSION_STATE.search(statement), statement
