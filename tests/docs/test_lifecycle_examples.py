"""The operating guides' examples (retries, fair shares, schedules, target policy, keys, metrics), each page's session run as written: the README's first scan, then the
page's own blocks in order, then the README's cleanup (``scripts/docs_examples.py``). Each page
gets a fresh migrated database of the test server."""

from __future__ import annotations

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


@pytest.mark.parametrize("page", PAGES)
def test_the_page_examples_run_as_written(page: str, make_database: Callable[..., str], tmp_path: Path) -> None:
    run_page(page, make_database(), tmp_path)
