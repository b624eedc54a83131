"""A private Patroni cluster: etcd (one member, or three) and two PostgreSQL nodes with synchronous replication.

Everything runs on 127.0.0.1, from a temporary directory, as processes of the caller's own
(never the distribution's services): ``etcd`` (the DCS: one member by default, which starts
fastest; ``etcd_members=3`` for a cluster that survives the loss of one member), and per node one ``patroni`` that
initialises, starts, promotes, demotes and rewinds its PostgreSQL 15 (``/usr/lib/postgresql/15/bin``).
The cluster runs ``synchronous_mode: true`` with ``synchronous_commit = on``: a COMMIT returns
only once the synchronous standby has flushed it, and Patroni fails over only to that standby,
so no acknowledged commit is lost by a failover.

* :func:`patroni_available` says why the cluster cannot run here (packages missing), or None.
* :func:`patroni_cluster` starts the cluster and yields a :class:`PatroniCluster`: its
  multi-host URL (``target_session_attrs=read-write``), the current leader, and the faults
  (:meth:`PatroniCluster.kill_leader_node`, :meth:`PatroniCluster.kill_postgres`,
  :meth:`PatroniCluster.switchover`, :meth:`PatroniCluster.failover`, and for etcd
  :meth:`PatroniCluster.kill_etcd` / :meth:`PatroniCluster.start_etcd`) with the waits that follow
  them (:meth:`PatroniCluster.wait_healthy`, :meth:`PatroniCluster.wait_etcd_whole`).

As root, patroni (and so PostgreSQL) runs as the unprivileged account of :mod:`support.servers`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from support.servers import SYSTEM_BINARIES, RunAs, free_port_in, scratch_directory
from support.waits import wait_until_sync

SCOPE = "leasehold-ha"
#: Where the cluster's ports come from (PostgreSQL, Patroni's REST API, etcd client and peer).
PORTS = (5560, 5599)


def patroni_available() -> str | None:
    """None when the cluster can run here; otherwise why not (for a skip)."""
    missing = [name for name in ("patroni", "patronictl", "etcd") if shutil.which(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install patroni etcd-server)"
    if not (SYSTEM_BINARIES / "postgres").is_file():
        return f"no PostgreSQL 15 server binaries under {SYSTEM_BINARIES}"
    return None


@dataclass
class Node:
    """One Patroni member: its PostgreSQL port, REST API port, and patroni process."""

    name: str
    pg_port: int
    api_port: int
    directory: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def config(self) -> Path:
        return self.directory / "patroni.yml"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{dbname}?sslmode=disable&gssencmode=disable"

    def api(self, path: str = "patroni") -> dict[str, object] | None:
        """Patroni's REST API answer for ``path``, or None when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/{path}", timeout=2) as answer:
                return json.loads(answer.read())  # type: ignore[no-any-return]
        except Exception as exc:  # an HTTP error answers with a body too (a replica's /primary: 503)
            body = getattr(exc, "read", None)
            if body is not None:
                with contextlib.suppress(Exception):
                    return json.loads(body())  # type: ignore[no-any-return]
            return None

    def postmaster_pid(self) -> int | None:
        path = self.data_dir / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(path.read_text().splitlines()[0])
        return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class EtcdMember:
    """One etcd member: its client and peer ports, data directory and process."""

    name: str
    client_port: int
    peer_port: int
    directory: Path
    proc: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict[str, object] | None:
        """``/v3/maintenance/status`` (its member id, the leader it knows, raft index), or None
        when it does not answer or has no quorum behind it."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.client_port}/v3/maintenance/status",
                                         data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=1) as answer:
                found = json.loads(answer.read())
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def healthy(self) -> bool:
        """The member answers ``/health`` true: it is part of a quorum with a leader."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.client_port}/health", timeout=1) as answer:
                return b'"true"' in answer.read()
        except OSError:
            return False


@dataclass
class PatroniCluster:
    """A running etcd and two Patroni nodes (see the module docstring)."""

    directory: Path
    run_as: RunAs
    etcd: list[EtcdMember]
    nodes: list[Node]
    events: list[str] = field(default_factory=list)

    # --- addresses ----------------------------------------------------------------------------

    def url(self, dbname: str = "postgres", *, user: str = "postgres") -> str:
        """The multi-host URL a Gateway uses: every node, the writable one chosen at connect time."""
        hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes)
        return (f"postgresql://{user}@{hosts}/{dbname}?target_session_attrs=read-write"
                f"&connect_timeout=2&sslmode=disable&gssencmode=disable")

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    # --- state --------------------------------------------------------------------------------

    def members(self) -> list[dict[str, object]]:
        """``/cluster`` from any node that answers (name, role, state, lag, timeline)."""
        for node in self.nodes:
            answer = node.api("cluster")
            if answer is not None:
                return list(answer.get("members", []))  # type: ignore[arg-type]
        return []

    def leader(self) -> Node | None:
        """The node that is the running leader and accepts writes now, or None."""
        for member in self.members():
            if member.get("role") == "leader" and member.get("state") == "running":
                node = self.node(str(member["name"]))
                if _writable(node):
                    return node
        return None

    def replica_of(self, leader: Node) -> Node:
        return next(n for n in self.nodes if n is not leader)

    def healthy(self) -> Node | None:
        """The leader, when the cluster is whole again: a writable leader and a streaming
        synchronous standby (Patroni's role ``sync_standby``)."""
        members = self.members()
        roles = {str(m.get("name")): (m.get("role"), m.get("state")) for m in members}
        if len(roles) != len(self.nodes):
            return None
        if sorted(r for r, _ in roles.values()) != ["leader", "sync_standby"]:
            return None
        if any(state not in ("running", "streaming") for _, state in roles.values()):
            return None
        return self.leader()

    def wait_leader(self, within: float = 60.0) -> Node:
        return wait_until_sync(self.leader, within, what=f"a writable leader\n{self._diagnosis()}", interval=0.2)

    def wait_healthy(self, within: float = 90.0) -> Node:
        """Wait until a leader accepts writes and the other node is its synchronous standby again."""
        return wait_until_sync(self.healthy, within, what=f"the cluster to be whole\n{self._diagnosis()}",
                               interval=0.2)

    # --- faults -------------------------------------------------------------------------------

    def kill_postgres(self, node: Node) -> None:
        """SIGKILL the node's postmaster (Patroni restarts it, or fails over when it cannot)."""
        pid = node.postmaster_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.events.append(f"kill -9 postgres of {node.name}")

    def kill_leader_node(self) -> Node:
        """The whole leader node dies: SIGKILL its patroni and its postmaster. Its leader key
        expires (``ttl``) and the synchronous standby is promoted. The dead node, returned, stays
        down until :meth:`start_node`."""
        leader = self.wait_leader()
        assert leader.proc is not None
        pid = leader.postmaster_pid()
        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.events.append(f"kill -9 node {leader.name}")
        return leader

    def switchover(self) -> Node:
        """``patronictl switchover`` to the synchronous standby (planned); the new leader."""
        leader = self.wait_healthy()
        candidate = self.replica_of(leader)
        self.patronictl("switchover", "--leader", leader.name, "--candidate", candidate.name, "--force")
        self.events.append(f"switchover {leader.name} -> {candidate.name}")
        return candidate

    def failover(self) -> Node:
        """``patronictl failover`` to the synchronous standby; the new leader."""
        leader = self.wait_healthy()
        candidate = self.replica_of(leader)
        self.patronictl("failover", "--candidate", candidate.name, "--force")
        self.events.append(f"failover {leader.name} -> {candidate.name}")
        return candidate

    def kill_postgres_and_fail_over(self, within: float = 60.0) -> Node:
        """SIGKILL the leader's postmaster, then ``patronictl failover`` to the standby (retried
        while Patroni is still busy with the killed server); the new leader."""
        leader = self.wait_healthy()
        candidate = self.replica_of(leader)
        self.kill_postgres(leader)
        deadline = time.monotonic() + within
        while True:
            try:
                self.patronictl("failover", "--candidate", candidate.name, "--force")
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.events.append(f"failover {leader.name} -> {candidate.name}")
        return candidate

    # --- etcd ---------------------------------------------------------------------------------

    def etcd_leader(self) -> EtcdMember | None:
        """The etcd member that is the raft leader now, as the live members agree, or None."""
        leaders = set()
        for member in self.etcd:
            if member.alive() and member.healthy():
                status = member.status()
                if status is not None:
                    leaders.add(str(status.get("leader")))
        if len(leaders) != 1:
            return None
        leader_id = leaders.pop()
        for member in self.etcd:
            status = member.status() if member.alive() else None
            if status is not None and str(status.get("header", {}).get("member_id")) == leader_id:  # type: ignore[union-attr]
                return member
        return None

    def etcd_whole(self) -> bool:
        """Every member runs, answers healthy, and they agree on one leader and one raft term."""
        if not all(m.alive() and m.healthy() for m in self.etcd):
            return False
        statuses = [m.status() for m in self.etcd]
        if any(s is None for s in statuses):
            return False
        return len({(str(s.get("leader")), str(s.get("raftTerm"))) for s in statuses if s is not None}) == 1

    def wait_etcd_whole(self, within: float = 60.0) -> None:
        wait_until_sync(self.etcd_whole, within, what="every etcd member to be healthy", interval=0.1)

    def kill_etcd(self, member: EtcdMember) -> None:
        """SIGKILL one etcd member (its data directory stays: :meth:`start_etcd` brings it back)."""
        assert member.proc is not None
        member.proc.send_signal(signal.SIGKILL)
        member.proc.wait()
        self.events.append(f"kill -9 etcd {member.name}")

    def start_etcd(self, member: EtcdMember) -> None:
        """Start (or restart) the member; with its data directory it rejoins the cluster it was in."""
        if member.alive():
            return
        initial = ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in self.etcd)
        log = (self.directory / f"{member.name}.log").open("ab")
        member.proc = subprocess.Popen(
            ["etcd", "--name", member.name, "--data-dir", str(member.directory),
             "--listen-client-urls", f"http://127.0.0.1:{member.client_port}",
             "--advertise-client-urls", f"http://127.0.0.1:{member.client_port}",
             "--listen-peer-urls", f"http://127.0.0.1:{member.peer_port}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{member.peer_port}",
             "--initial-cluster", initial, "--initial-cluster-state", "new",
             "--initial-cluster-token", SCOPE, "--listen-metrics-urls", "", "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT, env=_clean_env(), cwd=str(self.directory))
        log.close()

    def start_node(self, node: Node) -> None:
        """Start (or restart) the node's patroni: a node that was the leader rejoins as a
        replica (``pg_rewind`` when its timeline diverged)."""
        if node.alive():
            return
        # A postmaster the dead patroni left behind would block the new one's start.
        pid = node.postmaster_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        log = (node.directory / "patroni.log").open("ab")
        node.proc = subprocess.Popen(["patroni", str(node.config)], stdout=log, stderr=subprocess.STDOUT,
                                     user=self.run_as.uid, group=self.run_as.gid,
                                     extra_groups=[] if self.run_as.uid is not None else None,
                                     cwd=str(node.directory), env=_clean_env())
        log.close()

    def patronictl(self, *args: str) -> str:
        config = self.nodes[0].config
        proc = subprocess.run(["patronictl", "-c", str(config), *args], capture_output=True, text=True, timeout=60,
                              env=_clean_env())
        if proc.returncode != 0:
            raise RuntimeError(f"patronictl {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
        return proc.stdout

    def _diagnosis(self) -> str:
        tails = []
        for node in self.nodes:
            path = node.directory / "patroni.log"
            text = path.read_text(errors="replace")[-1500:] if path.exists() else ""
            tails.append(f"--- {node.name} (alive={node.alive()}):\n{text}")
        return f"members: {self.members()}\n" + "\n".join(tails)

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.terminate()
        for node in self.nodes:
            if node.proc is not None:
                try:
                    node.proc.wait(30)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait()
            pid = node.postmaster_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for member in self.etcd:
            if member.proc is not None and member.proc.poll() is None:
                member.proc.terminate()
        for member in self.etcd:
            if member.proc is not None:
                try:
                    member.proc.wait(10)
                except subprocess.TimeoutExpired:
                    member.proc.kill()
                    member.proc.wait()


def _writable(node: Node) -> bool:
    try:
        with psycopg.connect(node.url(), autocommit=True, connect_timeout=2) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
            return row is not None and row[0] is False
    except psycopg.Error:
        return False


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "PATRONI", "ETCD"))}
    env.update(LC_ALL="C.UTF-8", LANG="C.UTF-8")
    return env


def _node_config(node: Node, etcd_ports: list[int], *, ttl: int, loop_wait: int, retry_timeout: int) -> str:
    """Patroni's YAML for ``node`` (JSON is YAML)."""
    hba = ["local all all trust", "host all all 127.0.0.1/32 trust", "host replication all 127.0.0.1/32 trust"]
    config = {
        "scope": SCOPE,
        "name": node.name,
        "log": {"level": "INFO"},
        "restapi": {"listen": f"127.0.0.1:{node.api_port}", "connect_address": f"127.0.0.1:{node.api_port}"},
        "etcd3": {"hosts": [f"127.0.0.1:{port}" for port in etcd_ports]},
        "bootstrap": {
            "dcs": {
                "ttl": ttl, "loop_wait": loop_wait, "retry_timeout": retry_timeout,
                "maximum_lag_on_failover": 1048576,
                "synchronous_mode": True,
                "postgresql": {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    "parameters": {
                        "synchronous_commit": "on", "wal_level": "replica", "hot_standby": "on",
                        "wal_log_hints": "on", "max_connections": 100, "max_wal_senders": 10,
                        "max_replication_slots": 10, "shared_buffers": "32MB", "timezone": "UTC",
                        "wal_keep_size": "128MB",
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, "no-locale", {"username": "postgres"}, {"auth": "trust"}],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{node.pg_port}",
            "connect_address": f"127.0.0.1:{node.pg_port}",
            "data_dir": str(node.data_dir),
            "bin_dir": str(SYSTEM_BINARIES),
            "pgpass": str(node.directory / "pgpass"),
            "authentication": {"superuser": {"username": "postgres"}, "replication": {"username": "postgres"},
                               "rewind": {"username": "postgres"}},
            "parameters": {"unix_socket_directories": str(node.directory)},
            "pg_hba": hba,
        },
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
    }
    return json.dumps(config, indent=1)


@contextmanager
def patroni_cluster(*, ttl: int = 10, loop_wait: int = 1, retry_timeout: int = 4, etcd_members: int = 1,
                    within: float = 120.0) -> Iterator[PatroniCluster]:
    """etcd (``etcd_members`` of them: 1, or 3 for a quorum that survives one loss) and two
    Patroni nodes started, the cluster whole (a leader and its synchronous standby); everything
    stopped and removed at the end."""
    reason = patroni_available()
    if reason is not None:
        raise RuntimeError(reason)
    run_as = RunAs.for_servers(SYSTEM_BINARIES)
    base = scratch_directory("leasehold-patroni-", run_as)
    taken: list[int] = []

    def port() -> int:
        chosen = free_port_in(*PORTS, taken=tuple(taken))
        taken.append(chosen)
        return chosen

    etcd = [EtcdMember(f"etcd{i}", client_port=port(), peer_port=port(), directory=base / f"etcd{i}")
            for i in range(etcd_members)]
    nodes = []
    for i in range(2):
        directory = base / f"node{i}"
        directory.mkdir()
        directory.chmod(0o700)
        run_as.own(directory)
        nodes.append(Node(f"node{i}", pg_port=port(), api_port=port(), directory=directory))
    cluster = PatroniCluster(base, run_as, etcd, nodes)
    try:
        for member in etcd:
            cluster.start_etcd(member)
        wait_until_sync(lambda: all(m.healthy() for m in etcd), 30, what="etcd to answer", interval=0.1)
        for node in nodes:
            node.config.write_text(_node_config(node, [m.client_port for m in etcd], ttl=ttl, loop_wait=loop_wait,
                                                retry_timeout=retry_timeout))
            run_as.own(node.config)
        cluster.start_node(nodes[0])
        cluster.wait_leader(within)
        cluster.start_node(nodes[1])
        cluster.wait_healthy(within)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


def wait_writable(url: str, within: float = 60.0) -> float:
    """Wait until ``url`` (a multi-host URL) connects to a writable server; the seconds waited."""
    started = time.monotonic()

    def writes() -> bool:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SELECT txid_current()")
                return True
        except psycopg.Error:
            return False

    wait_until_sync(writes, within, what="a writable server behind the multi-host URL", interval=0.1)
    return time.monotonic() - started
