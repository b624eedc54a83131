"""A real local webhook receiver (an aiohttp server on 127.0.0.1) whose faults a test sets:
``down`` (nothing listens on its port), ``slow`` (answers after a delay), ``fail`` (answers 500),
``hold`` (keeps requests waiting until released). It verifies each request with the verification
snippet of the webhooks guide (executed from the page itself) and deduplicates by ``webhook-id``,
as the guide asks receivers to do."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from support.gateway import free_port
from support.waits import wait_until

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "operate" / "webhooks.md"


def documented_verify() -> Callable[..., None]:
    """The ``verify`` function of the guide's Python block, as a reader would paste it."""
    (block,) = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.DOTALL)
    scope: dict[str, Any] = {}
    exec(compile(block, str(GUIDE), "exec"), scope)  # the documented snippet, run as documented
    return scope["verify"]  # type: ignore[no-any-return]


@dataclass
class Receiver:
    """Faults apply to the n-th request (1-based) when ``fail(n)`` / ``slow(n)`` say so."""

    secrets: dict[str, str] = field(default_factory=dict)  # subscription url path -> secret
    fail: Callable[[int], bool] = lambda n: False
    slow: Callable[[int], bool] = lambda n: False
    slow_seconds: float = 0.0
    port: int = field(default_factory=free_port)
    requests: int = 0
    #: Every verified request's id, repeats included; processed: each id once (the dedup).
    received: Counter[str] = field(default_factory=Counter)
    processed: dict[str, dict[str, Any]] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    hold: asyncio.Event | None = None
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None
    _verify: Callable[..., None] = field(default_factory=documented_verify)

    def url(self, path: str = "hook") -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        n = self.requests
        body = await request.read()
        secret = self.secrets.get(request.path.strip("/"))
        try:
            assert secret is not None, f"no secret for {request.path}"
            self._verify(secret, request.headers, body)
        except (ValueError, AssertionError, KeyError) as exc:
            self.refused.append(str(exc))
            return web.Response(status=401)
        self.arrived.set()
        if self.hold is not None:
            await self.hold.wait()
        if self.slow(n):
            await asyncio.sleep(self.slow_seconds)  # the fault under test: an answer that comes too late
        if self.fail(n):
            return web.Response(status=500)
        delivery_id = request.headers["webhook-id"]
        self.received[delivery_id] += 1
        self.processed.setdefault(delivery_id, orjson.loads(body))  # a repeat is acknowledged, not redone
        return web.Response(status=204)

    async def up(self) -> None:
        app = web.Application()
        app.router.add_post("/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def down(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def wait_for(self, count: int, within: float = 30.0) -> None:
        await wait_until(lambda: len(self.processed) >= count, within,
                         what=f"{count} notifications processed", interval=0.05)
