"""The database roles the Gateway runs as, and the check it makes of its own at start.

``leasehold_app`` (made by the migrations, NOLOGIN) holds exactly the grants the Gateway needs:
read the tables, append to ``events`` and the audit tables, insert and update the projections —
never UPDATE, DELETE or TRUNCATE on the log, never DDL. :func:`create_app_login` makes a login role
that is a member of it and nothing else; the Gateway connects as that role. A Gateway connected
as a superuser or as the owner of the tables can rewrite the log past every trigger, so it says
so at start (:func:`privilege_warnings`).
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection, Connection, sql

from leasehold.persistence.rows import execute_named

APP_ROLE = "leasehold_app"
DEFAULT_LOGIN = "leasehold_gateway"

_STANDING = """
SELECT current_user AS role, r.rolsuper AS superuser, r.rolbypassrls AS bypassrls,
       pg_has_role(current_user, c.relowner, 'USAGE') AS owner
FROM pg_roles r, pg_class c
WHERE r.rolname = current_user AND c.oid = 'events'::regclass
"""


def create_app_login(conn: Connection[Any], name: str, password: str) -> bool:
    """Create (or reset the password of) the login role ``name``, a member of ``leasehold_app``
    only, with no other attribute; True when it was created. Run by a role that may create roles."""
    cur = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,))
    exists = cur.fetchone() is not None
    role = sql.Identifier(name)
    verb = sql.SQL("ALTER") if exists else sql.SQL("CREATE")
    conn.execute(sql.SQL("{} ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS NOREPLICATION INHERIT"
                         " PASSWORD {}").format(verb, role, sql.Literal(password)))
    conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(APP_ROLE), role))
    return not exists


async def privilege_warnings(conn: AsyncConnection[Any]) -> list[str]:
    """Why the current role is more than the Gateway needs (empty when it is not)."""
    cur = await execute_named(conn, _STANDING)
    row = await cur.fetchone()
    if row is None:
        return []
    user, superuser, bypassrls, owner = row.role, row.superuser, row.bypassrls, row.owner
    out = []
    if superuser:
        out.append(f"connected as {user}, a superuser: it can rewrite the event log past every trigger")
    elif owner:
        out.append(f"connected as {user}, the owner of the tables: it can disable the append-only triggers")
    if bypassrls and not superuser:
        out.append(f"connected as {user}, which bypasses row-level security")
    return out
