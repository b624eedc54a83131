"""What every benchmark here shares: which server to use, and scratch databases on it."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg
from psycopg import sql

from leasehold.cli.embedded import EmbeddedPostgres, with_database

MACHINE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def resolve_server_url(explicit: str | None) -> tuple[str, str]:
    """The maintenance-database URL of the server to use, and where it came from: ``--database-url``,
    else ``$BENCH_DATABASE_URL``, else the machine's server on 127.0.0.1:5432, else the embedded one."""
    if explicit:
        return explicit, "--database-url"
    env = os.environ.get("BENCH_DATABASE_URL")
    if env:
        return env, "BENCH_DATABASE_URL"
    try:
        psycopg.connect(MACHINE_URL, connect_timeout=3).close()
        return MACHINE_URL, "machine server on 127.0.0.1:5432"
    except psycopg.Error:
        pass
    server = EmbeddedPostgres(stop_at_exit=True)
    server.start()
    return server.url(), f"embedded server ({server.data_dir})"


def recreate_database(server_url: str, name: str) -> str:
    """Drop (forcefully) and create the scratch database ``name``; its URL."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_database(server_url, name)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


# --------------------------------------------------------------------------- who used the CPU

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_table() -> dict[int, tuple[int, str, float]]:
    """pid -> (ppid, comm, CPU seconds used so far), from /proc (empty where there is none)."""
    table: dict[int, tuple[int, str, float]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = entry.read_text()
        except OSError:
            continue
        head, _, rest = text.rpartition(")")
        fields = rest.split()
        table[int(entry.parent.name)] = (int(fields[1]), head.partition("(")[2],
                                         (int(fields[11]) + int(fields[12])) / TICKS)
    return table


def box_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy so far (all cores, from /proc/stat); 0 without /proc."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in first[1:9])
    return (user + nice + system + irq + softirq + steal) / TICKS


def descendants(table: dict[int, tuple[int, str, float]], root: int) -> set[int]:
    """``root`` and every process below it."""
    tree = {root}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _, _) in table.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


class CpuMeter:
    """CPU seconds spent between ``start()`` and ``stop()``: by the whole box, by PostgreSQL (every
    server process alive at ``stop()``, other clients' backends included), by labelled process
    trees (``roots``: label -> pid), and by this process's reaped children (``children``).

    Per-process figures come from /proc deltas, so a process that exited before ``stop()`` is
    missed, unless this process waited for it (then it is in ``children``); ``box`` counts
    everything, exited processes too. ``other`` is ``box`` minus everything attributed.
    """

    def __init__(self, roots: dict[str, int] | None = None) -> None:
        self.roots = roots or {}
        self.start()

    def start(self) -> None:
        self.t0, self.box0, self.before = time.perf_counter(), box_busy_seconds(), proc_table()
        self.self0, self.children0 = self._own()

    @staticmethod
    def _own() -> tuple[float, float]:
        t = os.times()
        return t.user + t.system, t.children_user + t.children_system

    def stop(self) -> dict[str, float]:
        """Seconds per owner, plus ``elapsed`` (wall seconds) and ``box``."""
        elapsed, box, after = time.perf_counter() - self.t0, box_busy_seconds() - self.box0, proc_table()
        own, children = self._own()
        trees = {label: descendants(after, root) for label, root in self.roots.items()}
        used = {label: 0.0 for label in self.roots} | {"postgres": 0.0}
        me = os.getpid()
        for pid, (_, comm, cpu) in after.items():
            prior = self.before.get(pid)
            delta = cpu - (prior[2] if prior is not None and prior[1] == comm else 0.0)
            if comm.startswith("postgres"):
                used["postgres"] += delta
                continue
            for label, tree in trees.items():
                if pid in tree and pid != me:
                    used[label] += delta
                    break
        used["self"] = own - self.self0
        used["children"] = children - self.children0
        used["other"] = max(0.0, box - sum(used.values()))
        return {"elapsed": elapsed, "box": box, **used}
