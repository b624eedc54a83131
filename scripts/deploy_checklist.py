#!/usr/bin/env python3
"""Run the deploy checklist (docs/guides/deploy/index.md) as written, from a wheel, outside the repository.

Builds the wheel of this checkout, creates a fresh virtualenv in a temporary directory (never
inside the repository), and runs the page's runnable block (see ``scripts/docs_examples.py``) with
``bash -euo pipefail`` in an empty working directory, with that virtualenv first on ``PATH``. The
block's own ``pip install 'leasehold[server]'`` installs the wheel (its directory is added to
pip's find-links). The database must be empty (``--database-url`` or ``$LEASEHOLD_DATABASE_URL``);
the ports are free ones picked here, handed over as the ``LEASEHOLD_*_PORT`` variables the block
reads.

``--installed DIR``: skip the build and the install and use the virtualenv ``DIR`` as it is (its
``pip install`` lines are skipped, nothing else): the quick run of the test suite
(``tests/docs/test_deploy_checklist.py``). Prints one line of timings; exit 0 when every step
succeeded.

    python scripts/deploy_checklist.py --database-url postgresql://postgres@127.0.0.1:5432/empty
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import docs_examples

ROOT = docs_examples.ROOT
PAGE = ROOT / "docs" / "guides" / "deploy" / "index.md"


def checklist() -> str:
    """The deploy checklist's shell block, as the page has it."""
    blocks = [e for e in docs_examples.examples(PAGE) if e.marker == "run"]
    if len(blocks) != 1 or blocks[0].language not in docs_examples.SHELL:
        raise SystemExit(f"{PAGE.relative_to(ROOT)} must have exactly one runnable shell block, the checklist")
    return blocks[0].code


def _find_links() -> list[str]:
    """pip's configured find-links (an environment variable would replace them, not add)."""
    done = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                          capture_output=True, text=True, check=False)
    return done.stdout.split() if done.returncode == 0 else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("LEASEHOLD_DATABASE_URL"),
                        help="an empty database (default: $LEASEHOLD_DATABASE_URL)")
    parser.add_argument("--installed", type=Path, metavar="VENV", help="use this virtualenv; no build, no install")
    parser.add_argument("--timeout", type=float, default=600, help="limit of the whole run, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (printed)")
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error("give --database-url or set LEASEHOLD_DATABASE_URL (an empty database)")
    checklist()  # refuse early when the page lost its block
    scratch = Path(tempfile.mkdtemp(prefix="leasehold-deploy-"))
    timings: dict[str, float] = {}
    extra_env = {"LEASEHOLD_LOG_LEVEL": "WARNING"}
    try:
        if args.installed is None:
            started = time.monotonic()
            wheels = scratch / "wheels"
            subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
                           check=True)
            timings["build"] = time.monotonic() - started
            started = time.monotonic()
            venv = scratch / "venv"
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            extra_env["PIP_FIND_LINKS"] = " ".join([str(wheels), *_find_links()])
            timings["venv"] = time.monotonic() - started
        else:
            venv = args.installed.resolve()
        work = scratch / "work"
        work.mkdir()
        outcome = docs_examples.run_session(PAGE, args.database_url, venv=venv, timeout=args.timeout,
                                            skip_pip=args.installed is not None, directory=work,
                                            extra_env=extra_env)
        timings["steps"] = outcome.seconds
        sys.stdout.write(outcome.output)
        if outcome.code != 0:
            for name in ("gateway.log", "worker.log"):
                log = work / name
                if log.exists():
                    sys.stderr.write(f"--- {name} ---\n{log.read_text()[-3000:]}\n")
        where = "installed from the wheel" if args.installed is None else f"in {venv}"
        spent = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timings.items())
        print(f"deploy_checklist: {'OK' if outcome.code == 0 else f'FAILED (exit {outcome.code})'}: the deploy "
              f"checklist {where}, run in {work}: {spent}")
        return 0 if outcome.code == 0 else 1
    finally:
        if args.keep:
            print(f"kept {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
