"""The console's plumbing: its route table, the signed-in wrapper (session, CSRF), the header's
navigation, error pages and redirects. The pages themselves are in :mod:`gateway.console.pages`,
:mod:`gateway.console.workers` and :mod:`gateway.console.audit`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from uuid import UUID

from aiohttp import web
from pydantic import ValidationError

from leasehold.domain.errors import LeaseholdError, NotFound
from leasehold.gateway.api.http import BadRequest, Handler, RouteTable
from leasehold.gateway.console import sessions
from leasehold.gateway.console.markup import Html, fmt, page
from leasehold.gateway.identity import Operator
from leasehold.gateway.keys import OPERATOR

routes = RouteTable()
ROOT = sessions.PATH
SIGN_IN = ROOT + "/sign-in"
UUID_PATTERN = "[0-9a-fA-F-]+"

Page = Callable[[web.Request, Operator, str], Awaitable[web.StreamResponse]]


def console(method: str, path: str, summary: str) -> Callable[[Handler], Handler]:
    return routes.route(method, path, summary=summary, auth="none", listeners=("operator",))


def signed_in(handler: Page) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A page for a signed-in operator: without a live session, a GET goes to the sign-in page
    (303) and a POST is refused (403); a POST must carry the session's CSRF token (403)."""
    async def wrapped(request: web.Request) -> web.StreamResponse:
        found = await sessions.session_operator(request)
        if found is None:
            if request.method == "GET":
                return redirect(SIGN_IN)
            return error(403, "You are not signed in (or your session ended).")
        operator, token = found
        request[OPERATOR] = operator
        csrf = sessions.csrf_token(token)
        if request.method == "POST":
            form = await request.post()
            if not sessions.csrf_matches(csrf, form.get("csrf")):
                return error(403, "This form has no valid CSRF token; reload the page and try again.")
        try:
            return await handler(request, operator, csrf)
        except LeaseholdError as exc:
            return error(exc.status, exc.message, operator=operator, csrf=csrf)
        except BadRequest as exc:
            return error(400, f"The form or filter is not valid: {exc.detail}.", operator=operator, csrf=csrf)
        except ValidationError:
            return error(400, "The form or filter is not valid.", operator=operator, csrf=csrf)
    wrapped.__name__ = handler.__name__
    return wrapped


NAV_ITEMS = (("", "Overview"), ("/scans", "Scans"), ("/workers", "Workers"), ("/audit", "Audit"))


def nav(operator: Operator, csrf: str) -> Html:
    who = "administrator" if operator.is_admin else f"organisation {operator.organization_id}"
    items = Html("".join(fmt('<li><a href="{}{}">{}</a></li>', ROOT, path, label) for path, label in NAV_ITEMS))
    return fmt('<nav aria-label="Console"><ul>{}</ul></nav><p>Signed in as {} ({})</p>'
               '<form method="post" action="{}/sign-out"><input type="hidden" name="csrf" value="{}">'
               '<button type="submit">Sign out</button></form>', items, operator.name, who, ROOT, csrf)


def error(status: int, message: str, *, operator: Operator | None = None, csrf: str = "") -> web.Response:
    navigation = nav(operator, csrf) if operator is not None else None
    return page(f"Error {status}", fmt('<p class="error" role="alert">{}</p>', message), nav=navigation,
                status=status)


def redirect(path: str) -> web.Response:
    """303 See Other: after a form post, the browser GETs ``path``."""
    return web.Response(status=303, headers={"Location": path})


def link(path: str, text: object) -> Html:
    return fmt('<a href="{}">{}</a>', path, text)


def task_link(task_id: UUID | None) -> Html | str:
    return link(f"{ROOT}/tasks/{task_id}", task_id) if task_id is not None else "—"


def path_id(request: web.Request, name: str, what: str) -> UUID:
    try:
        return UUID(request.match_info[name])
    except ValueError as exc:
        raise NotFound(f"no such {what}") from exc


def query_id(request: web.Request, name: str) -> UUID | None:
    """An optional id of the query string (absent or empty: None; not an id: 400)."""
    raw = request.query.get(name, "").strip()
    if not raw:
        return None
    try:
        return UUID(raw)
    except ValueError as exc:
        raise BadRequest(f"{name} is not an id") from exc


NOTHING = Html("")


def confirm_form(action: str, csrf: str, fields: Html = NOTHING) -> Html:
    """A confirmation form: a POST to ``action`` with the CSRF token, ``fields`` and Confirm."""
    return fmt('<form method="post" action="{}"><input type="hidden" name="csrf" value="{}">{}'
               '<p><button type="submit">Confirm</button></p></form>', action, csrf, fields)
