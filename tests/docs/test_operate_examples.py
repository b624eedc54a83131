"""The operating guides' examples (workers, scans, finding work, cancellation).

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
    "docs/guides/operate/index.md",
    "docs/guides/operate/workers.md",
    "docs/guides/operate/scans.md",
    "docs/guides/operate/finding-work.md",
    "docs/guides/operate/cancellation.md",
    "docs/guides/operate/bulk.md",
]

#: What a page's output must show, beyond every block succeeding.
EXPECT = {
    "docs/guides/operate/index.md": r"success \['127\.0\.0\.1:\d+/tcp'\]",
    "docs/guides/operate/scans.md": r"url https://127\.0\.0\.1:\d+",
    "docs/guides/operate/cancellation.md": r"CancelDelivered",
    "docs/guides/operate/bulk.md": r"0 tasks would be retried[\s\S]*cancel\s+finished",
    "docs/guides/operate/workers.md": r"False\nTrue",
}


@pytest.mark.parametrize("page", PAGES)
def test_the_page_examples_run_as_written(page: str, make_database: Callable[..., str], tmp_path: Path) -> None:
    outcome = run_page(page, make_database(), tmp_path)
    if page in EXPECT:
        assert re.search(EXPECT[page], outcome.output), outcome.output[-4000:]
