"""Plugins: finding the executable for a task type, and running it as a subprocess.

The protocol (see ``docs/guides/plugins.md``): the plugin reads one JSON document
``{"scope": {...}, "parameters": {...}}`` on stdin, writes one JSON object per line on stdout
(each with a string ``"type"``), and diagnostics on stderr. Exit 0 is success, 2 is "bad input"
(not retried), anything else a failure (retried). A record ``{"type": "error", "message": ...,
"retryable": false}`` fails the task too, and ``retryable`` says whether to retry it.

Each plugin runs in its own session (process group), so stopping it stops whatever it started:
SIGTERM to the group, SIGKILL after a grace period. On Linux the plugin also gets SIGKILL if the
worker process dies (``PR_SET_PDEATHSIG``), so a killed worker leaves no scanner running
unattended while its lease moves to another worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import pkgutil
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from leasehold.worker import plugins as builtin_plugins

__all__ = [
    "BUILTIN_PLUGINS",
    "EXIT_BAD_INPUT",
    "InvalidOutput",
    "PluginCommand",
    "PluginNotFound",
    "PluginProcess",
    "PluginResolver",
    "parse_record",
]

EXIT_BAD_INPUT = 2
STDERR_TAIL_CHARS = 3000

# Task types become file names: no separators, no leading dot.
_TASK_TYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _builtin_plugins() -> dict[str, str]:
    """Task type -> module of every plugin shipped in :mod:`worker.plugins`."""
    return {info.name.replace("_", "-"): f"leasehold.worker.plugins.{info.name}"
            for info in pkgutil.iter_modules(builtin_plugins.__path__)
            if info.name != "common" and not info.name.startswith("_")}


#: Task type -> module of the built-in plugins (``tcp-connect`` -> ``worker.plugins.tcp_connect``).
BUILTIN_PLUGINS: Mapping[str, str] = _builtin_plugins()


class PluginNotFound(Exception):
    """No plugin for this task type on this worker."""


@dataclass(frozen=True, slots=True)
class PluginCommand:
    task_type: str
    argv: tuple[str, ...]
    source: str  # "plugins-dir" or "built-in"


class PluginResolver:
    """task type -> ``--plugins-dir/<type>`` if executable there, else the built-in plugin."""

    def __init__(self, plugins_dir: Path | None, capabilities: Sequence[str] = ()) -> None:
        self.plugins_dir = plugins_dir
        self.capabilities = list(capabilities)

    def available(self) -> list[str]:
        """Every task type this worker could run (built-in and plugins-dir)."""
        found = set(BUILTIN_PLUGINS)
        if self.plugins_dir is not None and self.plugins_dir.is_dir():
            found.update(p.name for p in self.plugins_dir.iterdir()
                         if _TASK_TYPE_RE.match(p.name) and p.is_file() and os.access(p, os.X_OK))
        return sorted(found)

    def offered(self) -> list[str]:
        """The task types this worker runs: ``capabilities`` when given, else :meth:`available`."""
        return list(self.capabilities) if self.capabilities else self.available()

    def missing(self) -> list[str]:
        """Configured capabilities that have no plugin (a configuration error)."""
        available = set(self.available())
        return [c for c in self.capabilities if c not in available]

    def resolve(self, task_type: str) -> PluginCommand:
        if not _TASK_TYPE_RE.match(task_type):
            raise PluginNotFound(f"task type {task_type!r} is not a valid plugin name")
        if self.capabilities and task_type not in self.capabilities:
            raise PluginNotFound(f"this worker does not offer task type {task_type!r} "
                                 f"(its capabilities: {', '.join(self.capabilities)})")
        if self.plugins_dir is not None:
            path = self.plugins_dir / task_type
            if path.is_file():
                if not os.access(path, os.X_OK):
                    raise PluginNotFound(f"plugin {path} is not executable")
                return PluginCommand(task_type, (str(path.resolve()),), "plugins-dir")
        module = BUILTIN_PLUGINS.get(task_type)
        if module is None:
            where = f" and no file {task_type!r} in {self.plugins_dir}" if self.plugins_dir else ""
            raise PluginNotFound(f"no plugin for task type {task_type!r}: not a built-in plugin{where}")
        return PluginCommand(task_type, (sys.executable, "-m", module), "built-in")


# --------------------------------------------------------------------------------------------
# Output records
# --------------------------------------------------------------------------------------------


class InvalidOutput(Exception):
    """A stdout line that is not a JSON object with a string ``type``."""

    def __init__(self, line_number: int, reason: str) -> None:
        super().__init__(f"invalid output on stdout line {line_number}: {reason}")
        self.line_number, self.reason = line_number, reason


def parse_record(line: bytes, line_number: int) -> dict[str, Any] | None:
    """One stdout line -> its record; ``None`` for a blank line; :class:`InvalidOutput` otherwise."""
    text = line.strip()
    if not text:
        return None
    try:
        record = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidOutput(line_number, f"not JSON ({exc}): {_snippet(text)}") from None
    if not isinstance(record, dict):
        raise InvalidOutput(line_number, f"not a JSON object: {_snippet(text)}")
    kind = record.get("type")
    if not isinstance(kind, str) or not kind:
        raise InvalidOutput(line_number, f'no string "type": {_snippet(text)}')
    return record


def _snippet(text: bytes, limit: int = 120) -> str:
    shown = text[:limit].decode("utf-8", errors="replace")
    return repr(shown + ("…" if len(text) > limit else ""))


# --------------------------------------------------------------------------------------------
# The subprocess
# --------------------------------------------------------------------------------------------


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGKILL the child when the worker dies, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the worker died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


class PluginProcess:
    """A running plugin: its records on stdout, the tail of its stderr, and how to stop it."""

    def __init__(self, process: asyncio.subprocess.Process, command: PluginCommand,
                 on_stderr_line: Callable[[str], None] | None) -> None:
        self.process = process
        self.command = command
        self.pid = process.pid
        self._stderr_tail = bytearray()
        self._on_stderr_line = on_stderr_line
        self._stderr_task = asyncio.create_task(self._drain_stderr())

    @classmethod
    async def start(cls, command: PluginCommand, document: bytes | Path, *, cwd: Path,
                    env: Mapping[str, str] | None = None, max_line_bytes: int = 1024 * 1024,
                    on_stderr_line: Callable[[str], None] | None = None) -> PluginProcess:
        """Start the plugin and feed it ``document`` on stdin (then close stdin): bytes through a
        pipe, or a file (a large scope's input, written page by page) that the plugin reads as
        its stdin directly, so the worker never holds the document in memory."""
        with contextlib.ExitStack() as files:
            stdin: Any = asyncio.subprocess.PIPE
            if isinstance(document, Path):
                stdin = files.enter_context(document.open("rb"))  # the child keeps its own descriptor
            process = await asyncio.create_subprocess_exec(
                *command.argv, stdin=stdin, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=str(cwd), env=dict(env) if env is not None else None,
                start_new_session=True, preexec_fn=_die_with_parent(), limit=max_line_bytes + 1)
        plugin = cls(process, command, on_stderr_line)
        if isinstance(document, bytes):
            plugin._stdin_task = asyncio.create_task(plugin._feed(document))
        return plugin

    async def _feed(self, document: bytes) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        # A plugin that exits without reading its input is its own business (its exit code says).
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            stdin.write(document)
            await stdin.drain()
            stdin.close()
            await stdin.wait_closed()

    async def _drain_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        pending = b""
        while chunk := await stream.read(65536):
            self._stderr_tail += chunk
            del self._stderr_tail[:-STDERR_TAIL_CHARS * 4]
            if self._on_stderr_line is not None:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                pending = pending[-65536:]
                for line in lines:
                    self._on_stderr_line(line.decode("utf-8", errors="replace").rstrip())

    async def records(self) -> AsyncIterator[tuple[dict[str, Any], int]]:
        """Each record with its size in bytes, until stdout closes; raises :class:`InvalidOutput`."""
        stdout = self.process.stdout
        assert stdout is not None
        number = 0
        while True:
            try:
                line = await stdout.readline()
            except ValueError:  # asyncio's "chunk exceeds the limit"
                raise InvalidOutput(number + 1, "line longer than the record size limit") from None
            if not line:
                return
            number += 1  # a last line without its newline is accepted: the stream ended cleanly
            record = parse_record(line, number)
            if record is not None:
                yield record, len(line)

    async def wait(self) -> int:
        """Wait for the exit (and for stderr to be read); the exit code (-N: killed by signal N)."""
        code = await self.process.wait()
        self._signal_group(signal.SIGKILL)  # whatever it left behind in its group goes too
        # stderr normally closes with the group; a process that escaped the group may hold it open.
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._stderr_task), 1.0)
        return code

    async def stop(self, grace: float) -> int:
        """SIGTERM the plugin's process group, SIGKILL after ``grace`` seconds; the exit code."""
        if self.process.returncode is None:
            self._signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self.process.wait()), grace)
            except TimeoutError:
                self._signal_group(signal.SIGKILL)
        return await self.wait()

    def kill_now(self) -> None:
        """SIGKILL the plugin's process group at once (the worker is exiting)."""
        self._signal_group(signal.SIGKILL)

    def _signal_group(self, signum: int) -> None:
        # The group id is the plugin's pid (start_new_session); Linux does not reuse a pid while
        # a process group of that id still has members, so this never hits a stranger.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)

    def stderr_tail(self, limit: int = STDERR_TAIL_CHARS) -> str:
        text = bytes(self._stderr_tail).decode("utf-8", errors="replace").strip()
        if len(text) > limit:
            text = "…" + text[-limit:]
        return text

    async def close(self) -> None:
        """Make sure nothing is left running or unread."""
        if self.process.returncode is None:
            await self.stop(0.0)
        for task in (self._stdin_task, self._stderr_task):
            if task is None:
                continue
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    _stdin_task: asyncio.Task[None] | None = None
