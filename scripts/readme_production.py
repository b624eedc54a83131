#!/usr/bin/env python3
"""Run README.md's deploy checklist exactly as written, from a wheel, outside the repository.

Builds the wheel of this checkout, creates a fresh virtualenv in a temporary directory (never
inside the repository), and runs the ``sh`` block between the ``deploy-checklist`` markers of
README.md with ``bash -euo pipefail`` in an empty working directory, with that virtualenv first on
``PATH``. The block's own ``pip install 'leasehold[server]'`` installs the wheel (its directory is
added to pip's find-links). The database must be empty (``--database-url`` or
``$LEASEHOLD_DATABASE_URL``); the ports are free ones picked here, handed over as the
``LEASEHOLD_*_PORT`` variables the block reads.

``--installed DIR``: skip the build and the install and use the virtualenv ``DIR`` as it is (its
``pip install`` lines are skipped, nothing else): the quick run of the test suite
(``tests/test_readme_production.py``). Prints one line of timings; exit 0 when every step
succeeded.

    python scripts/readme_production.py --database-url postgresql://postgres@127.0.0.1:5432/empty
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"<!-- deploy-checklist:start -->\s*```sh\n(.*?)```\s*<!-- deploy-checklist:end -->", re.DOTALL)


def checklist(readme: Path = ROOT / "README.md") -> str:
    """The deploy checklist's shell block, as README.md has it."""
    found = _BLOCK.search(readme.read_text())
    if found is None:
        raise SystemExit("README.md has no deploy-checklist block")
    return found.group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    script = checklist()
    scratch = Path(tempfile.mkdtemp(prefix="leasehold-readme-"))
    timings: dict[str, float] = {}
    env = {k: v for k, v in os.environ.items() if not k.endswith("DATABASE_URL") and not k.startswith("LEASEHOLD_")}
    env.pop("PYTHONPATH", None)
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
            env["PIP_FIND_LINKS"] = " ".join([str(wheels), *_find_links()])
            timings["venv"] = time.monotonic() - started
        else:
            venv = args.installed.resolve()
            script = "\n".join(line for line in script.splitlines() if not line.startswith("pip install"))
        work = scratch / "work"
        work.mkdir()
        env.update({"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(venv),
                    "LEASEHOLD_DATABASE_URL": args.database_url, "LEASEHOLD_WORKER_PORT": str(free_port()),
                    "LEASEHOLD_OPERATOR_PORT": str(free_port()), "LEASEHOLD_HEALTH_PORT": str(free_port()),
                    "LEASEHOLD_LOG_LEVEL": "WARNING"})
        started = time.monotonic()
        # Its own session: on a timeout the Gateway and the agent it started go with it.
        proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            code = -1
        finally:
            # A failed step leaves what the block started in the background: stop it all.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        timings["steps"] = time.monotonic() - started
        for name in ("worker.log",):
            log = work / name
            if code != 0 and log.exists():
                sys.stderr.write(f"--- {name} ---\n{log.read_text()[-3000:]}\n")
        where = "installed from the wheel" if args.installed is None else f"in {venv}"
        spent = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timings.items())
        print(f"readme_production: {'OK' if code == 0 else f'FAILED (exit {code})'}: the deploy checklist "
              f"{where}, run in {work}: {spent}")
        return 0 if code == 0 else 1
    finally:
        if args.keep:
            print(f"kept {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
