"""Start-up time of the ``leasehold`` command: how long a scanner host waits for
``leasehold worker run --help``, and ``leasehold --help``. Prints numbers, asserts nothing.

Each command runs ``--runs`` times (after one untimed run that warms the file cache) as a fresh
process, its output discarded; a line gives the median, min and max wall time, and the median
CPU time (user + system) of the process, which a busy machine disturbs less than the wall time. The yardstick is
the bare interpreter of the same environment (``python -c pass``), run the same way, so the
``ratio_to_python`` of a command is comparable across machines. Goal: ``worker run --help``
under 0.5 s.

``--slim-venv DIR`` also measures a base install (no ``server`` extra): it creates a virtualenv
in DIR unless one is there, installs this checkout into it with pip (no extras, not editable,
so pip must reach the package index), prints which distributions it holds and whether any
belongs to the ``server`` extra, times ``worker run --help`` there, and shows what a server
command (``migrate --help``) prints there.

Usage: ``.venv/bin/python bench/cli_startup.py [--runs 11] [--leasehold PATH] [--slim-venv DIR]``.
``--leasehold`` times another environment's console script (its own interpreter is the yardstick).
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import statistics
import subprocess
import sys
import time
import tomllib
import venv
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
GOAL_WORKER_HELP_S = 0.5
COMMANDS = (("worker", "run", "--help"), ("--help",))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_runs(argv: list[str], runs: int) -> tuple[list[float], list[float]]:
    """(wall times, CPU times) of ``runs`` runs of ``argv`` after one untimed run; each must exit 0."""
    walls, cpus = [], []
    for index in range(runs + 1):
        cpu, started = _children_cpu(), time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        if index:
            walls.append(time.perf_counter() - started)
            cpus.append(_children_cpu() - cpu)
    return walls, cpus


def summary(walls: list[float], cpus: list[float]) -> str:
    return (f"runs={len(walls)} median_s={statistics.median(walls):.3f} min_s={min(walls):.3f} "
            f"max_s={max(walls):.3f} median_cpu_s={statistics.median(cpus):.3f}")


def measure(leasehold: Path, runs: int, label: str) -> None:
    """Print the yardstick line and one line per command for the environment of ``leasehold``."""
    python = leasehold.with_name("python")
    floor, floor_cpu = time_runs([str(python), "-c", "pass"], runs)
    print(f"python_startup {label}{summary(floor, floor_cpu)}", flush=True)
    for args in COMMANDS:
        walls, cpus = time_runs([str(leasehold), *args], runs)
        ratio = statistics.median(walls) / statistics.median(floor)
        print(f"cli_startup {label}command={shlex.quote(' '.join(args))} {summary(walls, cpus)} "
              f"ratio_to_python={ratio:.1f}", flush=True)
        if args[0] == "worker":
            met = statistics.median(walls) < GOAL_WORKER_HELP_S
            print(f"goal_worker_run_help_s {GOAL_WORKER_HELP_S} {label}met={met}", flush=True)


def server_extra() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {canonicalize_name(Requirement(text).name) for text in project["optional-dependencies"]["server"]}


def slim_venv(directory: Path) -> Path:
    """A virtualenv in ``directory`` holding the base install of this checkout; its ``leasehold``."""
    leasehold = directory / "bin" / "leasehold"
    if not leasehold.exists():
        started = time.perf_counter()
        venv.create(directory, with_pip=True)
        subprocess.run([str(directory / "bin" / "python"), "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", str(ROOT)], check=True)
        print(f"slim_venv_install_s {time.perf_counter() - started:.1f}", flush=True)
    listing = subprocess.run([str(directory / "bin" / "python"), "-m", "pip", "list", "--format=json",
                              "--disable-pip-version-check"], capture_output=True, text=True, check=True)
    installed = {canonicalize_name(item["name"]) for item in json.loads(listing.stdout)}
    server = sorted(installed & server_extra())
    print(f"slim_venv distributions={len(installed)} server_distributions={','.join(server) or 'none'}",
          flush=True)
    return leasehold


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=11, help="timed runs per command (default 11)")
    parser.add_argument("--leasehold", type=Path, default=Path(sys.executable).with_name("leasehold"),
                        help="the console script to time (default: the one beside this interpreter)")
    parser.add_argument("--slim-venv", type=Path, default=None, metavar="DIR",
                        help="also time a base install (no server extra) in this virtualenv, made if absent")
    args = parser.parse_args(argv)

    measure(args.leasehold, args.runs, "")
    if args.slim_venv is not None:
        leasehold = slim_venv(args.slim_venv.resolve())
        measure(leasehold, args.runs, "venv=slim ")
        done = subprocess.run([str(leasehold), "migrate", "--help"], capture_output=True, text=True, check=False)
        print(f"slim_server_command command='migrate --help' exit={done.returncode} "
              f"stderr={json.dumps(done.stderr.strip())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
