"""The console in a real browser: the system's Chromium, driven by Playwright
(:mod:`support.browser`), against an in-process Gateway on this test's database. Without a
Chromium on the machine every test here is skipped, saying why (``.ci/run`` installs it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import async_playwright

from support.browser import CHROMIUM_ARGS, LAPTOP, Console, chromium_binary
from support.gateway import RunningGateway


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if chromium_binary() is not None:
        return
    skip = pytest.mark.skip(reason="no Chromium on this machine (apt-get install chromium; .ci/run does it): "
                                   "the console's browser tests need /usr/bin/chromium")
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(skip)


@pytest.fixture
async def console(gateway: RunningGateway, tmp_path: Path) -> AsyncIterator[Console]:
    binary = chromium_binary()
    assert binary is not None  # skipped at collection otherwise
    async with async_playwright() as playwright:
        # The development CA is not in Chromium's store; the name and the TLS are real all the same.
        context = await playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=binary, headless=True, args=CHROMIUM_ARGS,
            ignore_https_errors=True, viewport=LAPTOP, locale="en-GB", timezone_id="UTC")
        context.set_default_timeout(15_000)
        page = context.pages[0] if context.pages else await context.new_page()
        try:
            yield Console(gateway, context, page)
        finally:
            await context.close()
