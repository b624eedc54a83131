"""The operating guides' examples (retries, fair shares, schedules, target policy, keys, metrics).

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
    "docs/guides/operate/retries.md",
    "docs/guides/operate/fair-shares.md",
    "docs/guides/operate/schedules.md",
    "docs/guides/operate/target-policy.md",
    "docs/guides/operate/api-keys.md",
    "docs/guides/operate/metrics.md",
]

#: What a page's output must show, beyond every block succeeding.
EXPECT = {
    "docs/guides/operate/retries.md": r"attempt #2 failed",
    "docs/guides/operate/target-policy.md": r"target-refused",
}


@pytest.mark.parametrize("page", PAGES)
def test_the_page_examples_run_as_written(page: str, make_database: Callable[..., str], tmp_path: Path) -> None:
    outcome = run_page(page, make_database(), tmp_path)
    if page in EXPECT:
        assert re.search(EXPECT[page], outcome.output), outcome.output[-4000:]
