"""Running a documentation page's session (``scripts/docs_examples.py``) in a test: on a fresh
database of the test server, in the test's own directory, with a report that names the failing
block and shows what the page's Gateway and worker logged."""

from __future__ import annotations

from pathlib import Path

from docs_support import ROOT, docs_examples

#: A session starts a Gateway and a worker agent and waits for real scans: minutes at most.
SESSION_TIMEOUT = 240


def run_page(page: str, database_url: str, directory: Path) -> docs_examples.Outcome:
    """Run ``page``'s session and fail the test, with its output and logs, unless it succeeded."""
    outcome = docs_examples.run_session(ROOT / page, database_url, directory=directory, timeout=SESSION_TIMEOUT)
    if outcome.code != 0:
        logs = "".join(f"\n--- {log.name} (end) ---\n{log.read_text()[-3000:]}"
                       for log in sorted(directory.glob("*.log")))
        verdict = "timed out" if outcome.code == -1 else f"exit {outcome.code}"
        raise AssertionError(f"{page}: the session failed ({verdict}, {outcome.seconds:.0f} s)\n"
                             f"{outcome.output[-6000:]}{logs}")
    return outcome
