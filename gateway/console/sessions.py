"""Console sessions, kept server-side in ``console_sessions`` (migration 0017).

Signing in with an operator API key opens a session: a random token goes to the browser as the
cookie (HttpOnly, Secure, SameSite=Strict, Max-Age), only its sha256 is stored, with the key's id
and an expiry. Every request finds the key behind the session again and checks it is still live
(not revoked, not expired), so revoking a key signs its sessions out. Signing out deletes the
row: the cookie is worthless from then on.

CSRF: each form carries a token derived from the session token (HMAC-SHA256 keyed with it), so
it is unguessable without the cookie and needs no storage; the sign-in form, before any session,
uses a random token that must match a cookie of its own (double submit).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from uuid import UUID

from aiohttp import web

from leasehold.gateway.auth import checked_api_key
from leasehold.gateway.identity import Operator
from leasehold.gateway.keys import SERVICES

COOKIE = "leasehold_console"
SIGN_IN_COOKIE = "leasehold_console_csrf"
#: How long a session lasts after sign-in (no sliding renewal: sign in again).
SESSION_SECONDS = 8 * 3600
PATH = "/console"


def _hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def csrf_token(session_token: str) -> str:
    """The CSRF token of the session whose cookie is ``session_token``."""
    return hmac.new(session_token.encode(), b"leasehold console csrf", hashlib.sha256).hexdigest()


def csrf_matches(expected: str, given: object) -> bool:
    return isinstance(given, str) and bool(given) and hmac.compare_digest(expected.encode(), given.encode())


def set_cookie(response: web.StreamResponse, name: str, value: str, max_age: int) -> None:
    response.set_cookie(name, value, max_age=max_age, path=PATH, secure=True, httponly=True, samesite="Strict")


async def open_session(request: web.Request, key: str) -> str | None:
    """A new session for the live operator key ``key`` (its token), or None for an unknown key."""
    services = request.app[SERVICES]
    found = await checked_api_key(request, key, door="console")  # RateLimited past the failure budget
    if found is None:
        return None
    token = secrets.token_urlsafe(32)
    async with services.db.transaction() as tx:
        tx.write("console_sessions", "console_sessions_expired_delete", {"now": None})
        tx.write("console_sessions", "console_session_insert", {
            "token_hash": _hash(token), "api_key_id": found.id, "now": None, "seconds": SESSION_SECONDS})
        await tx.commit()
    return token


async def session_operator(request: web.Request) -> tuple[Operator, str] | None:
    """The operator signed in with this request's cookie, and the session token; None when none."""
    token = request.cookies.get(COOKIE)
    if not token or len(token) > 100:
        return None
    async with request.app[SERVICES].db.read() as reader:
        row = await reader.one("console_session_operator", {"token_hash": _hash(token), "now": None})
    if row is None:
        return None
    return Operator(key_id=UUID(str(row.id)), name=row.name, organization_id=row.organization_id), token


async def close_session(request: web.Request, token: str) -> None:
    async with request.app[SERVICES].db.transaction() as tx:
        tx.write("console_sessions", "console_session_delete", {"token_hash": _hash(token)})
        await tx.commit()
