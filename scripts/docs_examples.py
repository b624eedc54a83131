"""The runnable examples of the documentation: find them, and run a page's examples as a script.

Every fenced ``sh``/``bash``/``python`` block of README.md and docs/ says whether it runs, with an
HTML comment on the line before its fence (invisible on the rendered page):

* ``<!-- run -->``: the block runs, in page order, in the page's session;
* ``<!-- run: cleanup -->``: it runs at the end of the session, after any page that continues
  this one (it stops what the page started);
* ``<!-- not run: REASON -->``: it does not, and says why (a systemd unit, a host that is not
  there, a sketch with placeholders).

A page's **session** is one ``bash -euo pipefail`` script, run in an empty working directory:
its shell blocks as written and its Python blocks fed to ``python3`` on stdin, in page order, so a
later block sees the variables and files an earlier one made. A page that goes on from another's
state says so once, anywhere on it: ``<!-- session: continues README.md -->`` (a path from the
repository's root); its session then begins with that page's blocks and ends with its cleanup
blocks.

The environment of a session (:func:`session_environment`) holds a database (``$LEASEHOLD_DATABASE_URL``,
empty: the examples migrate it) and free ports for the Gateway (``$LEASEHOLD_WORKER_PORT``,
``$LEASEHOLD_OPERATOR_PORT``, ``$LEASEHOLD_HEALTH_PORT``), which the examples read with the
defaults a reader gets (``${LEASEHOLD_WORKER_PORT:-8443}``). Nothing else is set up behind the
reader's back. tests/docs/ runs every session against the test server.

    python scripts/docs_examples.py list
    python scripts/docs_examples.py run README.md --database-url postgresql://postgres@127.0.0.1:5432/empty
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Fence languages that are examples a reader runs, and must therefore say whether a test does.
SHELL = frozenset({"sh", "bash", "shell"})
PYTHON = frozenset({"python", "py"})
EXAMPLE_LANGUAGES = SHELL | PYTHON
#: Folders of docs/ whose pages are not part of the site (notes waiting to be merged).
NOT_PAGES = ("_pending",)

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\n]*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<verb>run|not run)\s*(?::\s*(?P<arg>.*?))?\s*-->\s*$")
_SESSION = re.compile(r"<!--\s*session:\s*continues\s+(?P<page>\S+)\s*-->")
_HEREDOC = "__DOCS_EXAMPLE_PYTHON__"


@dataclass(frozen=True)
class Example:
    """One fenced code block of a page."""

    page: str  # path from the repository's root
    line: int  # the fence's line, 1-based
    language: str
    code: str
    #: ``run``, ``cleanup``, ``not run`` or ``""`` (no marker: an error for an example language).
    marker: str
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """README.md and every page of docs/ (not the notes waiting in docs/_pending/)."""
    found = [ROOT / "README.md"]
    for path in sorted((ROOT / "docs").rglob("*.md")):
        if not any(part in NOT_PAGES for part in path.relative_to(ROOT / "docs").parts):
            found.append(path)
    return found


def examples(page: Path) -> list[Example]:
    """Every fenced block of ``page`` in an example language, with the marker before it."""
    lines = page.read_text().splitlines()
    name = page.relative_to(ROOT).as_posix()
    out: list[Example] = []
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence, indent = opened.group("fence"), len(opened.group("indent"))
        language = (opened.group("info").split() or [""])[0].lower()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = "\n".join(line[indent:] for line in lines[i + 1:end]) + "\n"
        if language in EXAMPLE_LANGUAGES:
            marker, reason = "", ""
            before = _MARKER.match(lines[i - 1]) if i > 0 else None
            if before:
                arg = (before.group("arg") or "").strip()
                if before.group("verb") == "not run":
                    marker, reason = "not run", arg
                else:
                    marker = "cleanup" if arg == "cleanup" else "run" if not arg else f"bad: {arg}"
            out.append(Example(name, i + 1, language, body, marker, reason))
        i = end + 1
    return out


def continues(page: Path) -> Path | None:
    """The page whose session this page's session goes on from, if it says so."""
    found = _SESSION.search(page.read_text())
    return ROOT / found.group("page") if found else None


def session_examples(page: Path) -> list[Example]:
    """The blocks a page's session runs, in order: the pages it continues first, then its own,
    then the cleanup blocks (its own first, then those of the pages it continues)."""
    chain: list[Path] = []
    current: Path | None = page
    while current is not None:
        if current in chain:
            raise ValueError(f"the session of {page} continues itself: {' -> '.join(map(str, chain))}")
        chain.append(current)
        current = continues(current)
    chain.reverse()
    runs, cleanups = [], []
    for member in chain:
        own = examples(member)
        runs += [e for e in own if e.marker == "run"]
        cleanups = [e for e in own if e.marker == "cleanup"] + cleanups
    return runs + cleanups


def has_session(page: Path) -> bool:
    """Whether the page has a block of its own to run."""
    return any(e.marker in ("run", "cleanup") for e in examples(page))


def script(page: Path, *, skip_pip: bool = False) -> str:
    """The page's session as one bash script; each block announces itself on stderr, so a failure
    names the block it happened in."""
    parts = ["set -euo pipefail", "trap 'echo \"docs example failed in $DOCS_EXAMPLE\" >&2' ERR", ""]
    for example in session_examples(page):
        code = example.code
        if skip_pip:
            code = "".join(line for line in code.splitlines(keepends=True) if not line.startswith("pip install"))
        parts.append(f"DOCS_EXAMPLE={example.where}")
        if example.language in PYTHON:
            parts += [f"python3 - <<'{_HEREDOC}'", code.rstrip("\n"), _HEREDOC]
        else:
            parts.append(code.rstrip("\n"))
        parts.append("")
    return "\n".join(parts) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session_environment(database_url: str, venv: Path) -> dict[str, str]:
    """What a session runs with: this machine's environment without any leasehold or database
    setting of its own, the virtualenv first on ``PATH``, an empty database and free ports."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("DATABASE_URL") and not k.startswith("LEASEHOLD_")}
    env.pop("PYTHONPATH", None)
    env.update({"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(venv),
                "LEASEHOLD_DATABASE_URL": database_url, "LEASEHOLD_WORKER_PORT": str(free_port()),
                "LEASEHOLD_OPERATOR_PORT": str(free_port()), "LEASEHOLD_HEALTH_PORT": str(free_port())})
    return env


@dataclass(frozen=True)
class Outcome:
    code: int  # the script's exit status; -1 after the timeout
    output: str  # stdout and stderr, interleaved
    seconds: float
    directory: Path


def run_session(page: Path, database_url: str, *, venv: Path | None = None, timeout: float = 300,
                skip_pip: bool = False, directory: Path | None = None,
                extra_env: dict[str, str] | None = None) -> Outcome:
    """Run the page's session in ``directory`` (default: a new temporary one) with the
    virtualenv ``venv`` (default: this Python's); everything it started in the background is
    killed when it ends (it runs in a process group of its own)."""
    venv = venv or Path(sys.executable).parent.parent
    work = directory or Path(tempfile.mkdtemp(prefix="leasehold-docs-"))
    env = {**session_environment(database_url, venv), **(extra_env or {})}
    started = time.monotonic()
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(["bash", "-c", script(page, skip_pip=skip_pip)], cwd=work, env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = -1
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.seek(0)
        output = log.read()
    return Outcome(code, output, time.monotonic() - started, work)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="every example with its marker")
    run = sub.add_parser("run", help="run one page's session")
    run.add_argument("page", type=Path, help="path from the repository's root, e.g. README.md")
    run.add_argument("--database-url", default=os.environ.get("LEASEHOLD_DATABASE_URL"),
                     help="an empty database (default: $LEASEHOLD_DATABASE_URL)")
    run.add_argument("--timeout", type=float, default=300)
    run.add_argument("--print", action="store_true", help="print the script instead of running it")
    args = parser.parse_args(argv)
    if args.action == "list":
        for page in pages():
            for e in examples(page):
                print(f"{e.where}\t{e.language}\t{e.marker or 'UNMARKED'}\t{e.reason}")
        return 0
    page = (ROOT / args.page).resolve()
    if args.print:
        print(script(page), end="")
        return 0
    if not args.database_url:
        parser.error("give --database-url or set LEASEHOLD_DATABASE_URL (an empty database)")
    outcome = run_session(page, args.database_url, timeout=args.timeout)
    print(outcome.output, end="")
    print(f"docs_examples: {args.page}: {'OK' if outcome.code == 0 else f'FAILED (exit {outcome.code})'} "
          f"in {outcome.seconds:.1f} s, in {outcome.directory}")
    return 0 if outcome.code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
