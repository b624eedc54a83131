"""The audit guides' and the plugin guide's examples, each page's session run as written: the README's first scan, then the
page's own blocks in order, then the README's cleanup (``scripts/docs_examples.py``). Each page
gets a fresh migrated database of the test server."""

from __future__ import annotations

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


@pytest.mark.parametrize("page", PAGES)
def test_the_page_examples_run_as_written(page: str, make_database: Callable[..., str], tmp_path: Path) -> None:
    run_page(page, make_database(), tmp_path)
