"""Every example of the README and the docs says whether a test runs it, and every page with a
session is run by one of the tests/docs modules (no database: these read the pages only)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from docs_support import ROOT, docs_examples

PAGES = docs_examples.pages()
#: The modules that run page sessions, each with its PAGES list.
SESSION_MODULES = sorted(Path(__file__).parent.glob("test_*_examples.py"))


def test_every_shell_and_python_block_is_marked_run_or_not_run() -> None:
    unmarked = [e.where for page in PAGES for e in docs_examples.examples(page) if not e.marker]
    assert not unmarked, ("blocks without <!-- run --> or <!-- not run: REASON --> on the line before "
                          f"their fence: {unmarked}")


def test_a_block_that_is_not_run_says_why_and_markers_are_known() -> None:
    problems = [e.where for page in PAGES for e in docs_examples.examples(page)
                if (e.marker == "not run" and not e.reason.strip()) or e.marker.startswith("bad")]
    assert not problems, problems


def test_sessions_continue_pages_that_exist_and_have_blocks_to_run() -> None:
    for page in PAGES:
        base = docs_examples.continues(page)
        if base is not None:
            assert base.is_file(), f"{page}: continues {base}, which does not exist"
            assert docs_examples.has_session(base), f"{page}: continues {base}, which runs nothing"
            docs_examples.session_examples(page)  # no cycle


def test_the_readme_runs_a_first_scan_and_stops_what_it_started() -> None:
    readme = docs_examples.examples(ROOT / "README.md")
    runs = "".join(e.code for e in readme if e.marker == "run")
    for step in ("leasehold migrate", "leasehold db create-app-role", "leasehold gateway serve",
                 "leasehold worker run", "leasehold scans create", "--step tcp-connect", "leasehold scans assets $SCAN"):
        assert step in runs, step
    assert [e.marker for e in readme].count("cleanup") == 1


def test_every_page_with_a_session_is_run_by_a_test_module() -> None:
    listed: list[str] = []
    for module in SESSION_MODULES:
        tree = ast.parse(module.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "PAGES" for t in node.targets):
                listed += ast.literal_eval(node.value)
    assert len(listed) == len(set(listed)), "a page is run twice"
    # The README's session runs in test_readme_first_scan.py, the deploy checklist's in
    # test_deploy_checklist.py (from a virtualenv, as a reader installs it).
    listed += ["README.md", "docs/guides/deploy/index.md"]
    with_sessions = {page.relative_to(ROOT).as_posix() for page in PAGES if docs_examples.has_session(page)}
    assert with_sessions == set(listed), {"not run by any module": with_sessions - set(listed),
                                          "listed but without a session": set(listed) - with_sessions}


def test_the_readme_is_short_and_its_links_lead_somewhere() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    missing = [t for t in targets if not t.startswith(("http://", "https://")) and not (ROOT / t).exists()]
    assert not missing, missing


@pytest.mark.parametrize("page", [p.relative_to(ROOT).as_posix() for p in PAGES])
def test_no_page_refers_to_readme_sections_that_moved(page: str) -> None:
    text = (ROOT / page).read_text()
    assert not re.search(r"README['’]?s? \"|see the README|\(see README", text), page
