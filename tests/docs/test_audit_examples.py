"""The audit guides' and the plugin guide's examples.

Each page's session runs as written: the README's first scan, then the page's own blocks in
order, then the README's cleanup (``scripts/docs_examples.py``), on a fresh migrated database of
the test server."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from docs_sessions import run_page

pytestmark = pytest.mark.slow

PAGES = [
    "docs/guides/audit/index.md",
    "docs/guides/audit/seals.md",
    "docs/guides/audit/retention.md",
    "docs/guides/plugins.md",
]

#: What a page's output must show, beyond every block succeeding.
EXPECT = {
    "docs/guides/plugins.md": r"127\.0\.0\.1:22/tcp\n127\.0\.0\.1:80/tcp|127\.0\.0\.1:80/tcp\n127\.0\.0\.1:22/tcp",
    "docs/guides/audit/seals.md": r"OK",
}


@pytest.mark.parametrize("page", PAGES)
def test_the_page_examples_run_as_written(page: str, make_database: Callable[..., str], tmp_path: Path) -> None:
    outcome = run_page(page, make_database(), tmp_path)
    if page in EXPECT:
        assert re.search(EXPECT[page], outcome.output), outcome.output[-4000:]
