"""Which schema revision the Gateway was built for, and whether the database is at it.

The Gateway refuses to start unless the database's schema is at :func:`expected_revision` (the
head of the migrations it ships with), and ``/readyz`` reports the revision it finds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from leasehold.persistence.queries import QUERIES
from leasehold.persistence.rows import named_rows
from leasehold.persistence.transaction import Database

__all__ = ["SchemaStatus", "expected_revision", "read_revision", "read_revision_async", "schema_status", "status_of"]


@cache
def expected_revision() -> str | None:
    """The head revision of the migrations installed with this Gateway."""
    from leasehold.migrations.runner import head  # alembic's script directory: read once, when needed

    return head()


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """The schema revision found against the one expected."""

    found: str | None
    expected: str | None

    @property
    def current(self) -> bool:
        return self.found is not None and self.found == self.expected

    def problem(self) -> str | None:
        """Why the Gateway cannot serve this schema, or ``None`` when it can."""
        if self.current:
            return None
        if self.found is None:
            return (f"the database is not migrated (no schema revision; this Gateway needs {self.expected}): "
                    "run `leasehold migrate`")
        return (f"the database schema is at revision {self.found}, this Gateway needs {self.expected}: "
                "run `leasehold migrate` with the same version of leasehold")

    def as_json(self) -> dict[str, Any]:
        return {"revision": self.found, "expected": self.expected, "current": self.current}


def status_of(found: str | None) -> SchemaStatus:
    return SchemaStatus(found, expected_revision())


def read_revision(conn: Any) -> str | None:
    """The revision of a synchronous psycopg connection's database (``None``: never migrated)."""
    if not conn.cursor(row_factory=named_rows).execute(QUERIES["schema_migrated"]).fetchone().migrated:
        return None
    row = conn.cursor(row_factory=named_rows).execute(QUERIES["schema_revision"]).fetchone()
    return row.version_num if row else None


async def read_revision_async(conn: Any) -> str | None:
    """:func:`read_revision` on an asynchronous psycopg connection."""
    cur = conn.cursor(row_factory=named_rows)
    await cur.execute(QUERIES["schema_migrated"])
    if not (await cur.fetchone()).migrated:
        return None
    await cur.execute(QUERIES["schema_revision"])
    row = await cur.fetchone()
    return row.version_num if row else None


async def schema_status(db: Database) -> SchemaStatus:
    """The schema revision of the Gateway's database against the expected one."""
    async with db.read() as reader:
        migrated = await reader.one("schema_migrated", {})
        row = await reader.one("schema_revision", {}) if migrated and migrated.migrated else None
    return status_of(row.version_num if row else None)
