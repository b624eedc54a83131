"""Every console route, in the order they are matched: the pages, then the HTML 404 that answers
any other path under ``/console`` (with the navigation when signed in)."""

from __future__ import annotations

from aiohttp import web

from leasehold.gateway.console import audit, pages, sessions, workers
from leasehold.gateway.console.web import ROOT, console, error, routes

__all__ = ["audit", "pages", "routes", "workers"]


@console("*", ROOT + "/{tail:.*}", "Console: any other path is an HTML 404")
async def not_found(request: web.Request) -> web.StreamResponse:
    found = await sessions.session_operator(request)
    if found is None:
        return error(404, "There is no such page.")
    operator, token = found
    return error(404, "There is no such page.", operator=operator, csrf=sessions.csrf_token(token))
