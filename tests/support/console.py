"""A browser without JavaScript for the console's HTTP tests: a cookie jar on the operator port,
pages with their CSRF token and their tables' cells."""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any
from uuid import UUID

import aiohttp

from support.gateway import ADMIN_KEY, RunningGateway
from support.waits import wait_until

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class Page:
    status: int
    text: str
    headers: Any

    @property
    def csrf(self) -> str:
        found = CSRF.search(self.text)
        assert found is not None, self.text
        return found.group(1)

    def rows(self, caption_start: str) -> list[list[str]]:
        """The body rows (cell texts) of the table whose caption starts with ``caption_start``."""
        parser = _Tables()
        parser.feed(self.text)
        for caption, rows in parser.tables:
            if caption.startswith(caption_start):
                return rows
        raise AssertionError(f"no table {caption_start!r} in {self.text}")


class _Tables(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables: list[tuple[str, list[list[str]]]] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag == "table":
            self.tables.append(("", []))
        elif tag == "caption":
            self._in = "caption"
        elif tag == "tr" and self._in != "thead":
            self.tables[-1][1].append([])
        elif tag == "td":
            self._in = "td"
            self.tables[-1][1][-1].append("")
        elif tag == "thead":
            self._in = "thead"

    def handle_endtag(self, tag: str) -> None:
        if tag in ("caption", "td", "thead"):
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "caption":
            caption, rows = self.tables[-1]
            self.tables[-1] = (caption + data, rows)
        elif self._in == "td":
            self.tables[-1][1][-1][-1] += data


class Browser:
    """A client with a cookie jar on the operator port, as a browser without JavaScript."""

    def __init__(self, gw: RunningGateway, base: str | None = None,
                 session: aiohttp.ClientSession | None = None) -> None:
        self.base = base or gw.operator_url
        if session is None:
            ctx = ssl.create_default_context(cafile=str(gw.pki.ca_cert))
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx))
            gw.sessions.append(session)
        self.session = session

    async def get(self, path: str) -> Page:
        async with self.session.get(self.base + path, allow_redirects=False) as r:
            return Page(r.status, await r.text(), r.headers)

    async def post(self, path: str, form: dict[str, str]) -> Page:
        async with self.session.post(self.base + path, data=form, allow_redirects=False) as r:
            return Page(r.status, await r.text(), r.headers)

    async def sign_in(self, key: str = ADMIN_KEY) -> Page:
        form = await self.get("/console/sign-in")
        assert form.status == 200
        return await self.post("/console/sign-in", {"csrf": form.csrf, "key": key})

    def cookie(self) -> str:
        for morsel in self.session.cookie_jar:
            if morsel.key == "leasehold_console":
                return morsel.value
        raise AssertionError("no session cookie")


async def signed_in(gw: RunningGateway, key: str = ADMIN_KEY) -> Browser:
    browser = Browser(gw)
    reply = await browser.sign_in(key)
    assert reply.status == 303 and reply.headers["Location"] == "/console", (reply.status, reply.text)
    return browser


async def state_of(gw: RunningGateway, task_id: UUID) -> str:
    return str(await gw.count("SELECT state FROM worker_tasks WHERE id = %s", task_id))


async def wait_for_state(gw: RunningGateway, task_id: UUID, states: tuple[str, ...], within: float = 10) -> str:
    async def reached() -> str | None:
        state = await state_of(gw, task_id)
        return state if state in states else None

    return await wait_until(reached, within, what=f"task {task_id} to be {'/'.join(states)}")
