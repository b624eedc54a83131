"""Drive the console in the system's Chromium (Debian's ``chromium`` package) with Playwright.

No browser is ever downloaded: Playwright only drives the binary at ``/usr/bin/chromium`` (or
``$LEASEHOLD_CHROMIUM``, or the ``chromium`` on PATH). With ``LEASEHOLD_CONSOLE_SCREENSHOTS=1``
(``make screenshots``) :meth:`Console.shot` writes a PNG of the page into ``docs/console/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

from playwright.async_api import BrowserContext, Page

from support.gateway import ADMIN_KEY, RunningGateway, WorkerClient
from support.waits import wait_until

DOCS = Path(__file__).resolve().parents[2] / "docs" / "console"
SCREENSHOTS = os.environ.get("LEASEHOLD_CONSOLE_SCREENSHOTS") == "1"
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
TASK_STATES = ("pending", "leased", "running", "retry_wait", "completed", "failed_terminal", "cancelling",
               "cancelled")
#: What Chromium is started with: headless, and nothing that would reach out of this machine.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_binary() -> str | None:
    """The system's Chromium, or None when this machine has none."""
    for candidate in (os.environ.get("LEASEHOLD_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class Console:
    """One browser (a fresh profile) on the Gateway's operator port."""

    def __init__(self, gateway: RunningGateway, context: BrowserContext, page: Page) -> None:
        self.gateway = gateway
        self.context = context
        self.page = page
        self.base = gateway.operator_url

    def url(self, path: str) -> str:
        return self.base + path

    async def goto(self, path: str) -> int:
        """Open ``path`` (following redirects); the final answer's status."""
        response = await self.page.goto(self.url(path))
        assert response is not None
        return response.status

    async def sign_in(self, key: str = ADMIN_KEY) -> None:
        """Sign in through the form, as a person would; lands on the overview."""
        await self.goto("/console/sign-in")
        await self.page.get_by_label("Operator API key").fill(key)
        await self.page.get_by_role("button", name="Sign in").click()
        await self.page.wait_for_url(self.url("/console"))

    async def rows(self, caption: str, page: Page | None = None) -> list[list[str]]:
        """The body rows (cell texts) of the table whose caption contains ``caption``."""
        page = page or self.page
        table = page.locator("table").filter(has=page.locator("caption", has_text=caption))
        return await table.locator("tbody tr").evaluate_all(
            "rows => rows.map(r => Array.from(r.cells, c => c.innerText.trim()))")

    async def headers(self, caption: str, page: Page | None = None) -> list[str]:
        page = page or self.page
        table = page.locator("table").filter(has=page.locator("caption", has_text=caption))
        return await table.locator("thead th").evaluate_all("cells => cells.map(c => c.innerText.trim())")

    async def shot(self, name: str, page: Page | None = None) -> None:
        """``docs/console/<name>.png`` of the whole page, when screenshots are asked for."""
        if SCREENSHOTS:
            DOCS.mkdir(parents=True, exist_ok=True)
            await (page or self.page).screenshot(path=str(DOCS / f"{name}.png"), full_page=True)

    async def reload_until(self, check: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
        """Reload the page until ``check()`` holds."""

        async def shown() -> bool:
            if await check():
                return True
            await self.page.reload()
            return False

        await wait_until(shown, within, what=f"the page {self.page.url} to show it", interval=0.1)

    async def session_cookie(self) -> dict[str, Any] | None:
        for cookie in await self.context.cookies(self.url("/console")):
            if cookie["name"] == "leasehold_console":
                return dict(cookie)
        return None


# --- what the tests read from the database and the page ------------------------------------


async def column(gateway: RunningGateway, query: str, *params: Any) -> list[Any]:
    async with gateway.pool.connection() as conn:
        cur = await conn.execute(query, params)
        return [row[0] for row in await cur.fetchall()]


async def state_of(gateway: RunningGateway, task_id: UUID) -> str:
    return str(await gateway.count("SELECT state FROM worker_tasks WHERE id = %s", task_id))


async def task_state_shown(console: Console) -> str:
    (row,) = await console.rows("The task")
    headers = await console.headers("The task")
    return row[headers.index("State")]


@asynccontextmanager
async def heartbeat(worker: WorkerClient, lease: dict[str, Any]) -> AsyncIterator[list[str]]:
    """The worker's side while the test runs: it renews its lease every 100 ms, as an agent does,
    and when a renewal says the task is cancelled it stops and acknowledges. Yields what it did."""
    done: list[str] = []

    async def beat() -> None:
        while True:
            renewed = await worker.write(lease, "renew")
            assert renewed.status == 200, renewed.body
            if renewed.body["cancel_requested"]:
                acked = await worker.write(lease, "cancel-ack")
                assert acked.status == 200, acked.body
                done.append(acked.body["task"]["state"])
                return
            await asyncio.sleep(0.1)  # the renewal cadence of an agent, which this stands in for

    runner = asyncio.create_task(beat())
    try:
        yield done
    finally:
        if not runner.done():
            runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner


async def shows_state(console: Console, state: str) -> bool:
    return await task_state_shown(console) == state
