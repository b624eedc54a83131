"""One leased task, from plugin start to the last write on its attempt.

While the plugin runs, five things happen at once:

* **pump** — read the plugin's stdout, validate each line, hand records to the batcher;
* **sender** — report ``progress``, then send each cut batch until it is acknowledged;
* **renewer** — renew the lease every ``lease_seconds / 3``; a renewal saying
  ``cancel_requested`` (or a 409) stops the plugin;
* **watchdog** — stop the plugin so that it is gone by the attempt's execution deadline;
* **batch timer** — cut a batch when its oldest record is ``batch_seconds`` old.

The first of these to have something to say decides how the attempt ends (:class:`Ending`):

======================  =================================================================
plugin exited 0         ``complete`` carrying the final batch
plugin failed           ``fail`` with exit code and stderr tail (not retried: exit code 2,
                        or an ``error`` record with ``"retryable": false``)
invalid output          stop the plugin, ``fail`` (retryable) naming the line
deadline                stop the plugin, write nothing: the Gateway ends the attempt as a
                        ``timeout`` at the deadline (never retried)
cancel requested        stop the plugin, ``cancel-ack``
lease lost              stop the plugin, write nothing more (someone else owns the task now)
worker shutting down    stop the plugin, ``fail`` (retryable)
worker error            stop the plugin, ``fail`` (retryable) with what went wrong
======================  =================================================================

Time: the worker never compares its wall clock with the Gateway's. The lease and deadline
durations come from the Gateway's own timestamps (``lease_expires_at - leased_at``,
``deadline_at - leased_at``) and are counted on the local monotonic clock from when the lease
arrived (or, if the acquire had to be retried, from when it was first sent: earlier, so safe).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import orjson

from leasehold.domain.scopes import ScopeAssembler, ScopeMismatch, ScopeRef
from leasehold.protocol.targets import refused_target
from leasehold.protocol.wire import AcquireMore, Lease, ScopeRefView
from leasehold.worker.batcher import Batch, Batcher
from leasehold.worker.client import (
    AttemptRef,
    GatewayClient,
    GatewayError,
    GatewayUnavailable,
    LeaseLost,
    Rejected,
    TaskWasCancelled,
)
from leasehold.worker.plugin import (
    EXIT_BAD_INPUT,
    InvalidOutput,
    PluginCommand,
    PluginNotFound,
    PluginProcess,
    PluginResolver,
)
from leasehold.worker.settings import WorkerSettings
from leasehold.worker.status import RunningTask, Status

__all__ = ["AcquireTiming", "Carry", "Ending", "TaskRunner"]

log = logging.getLogger("leasehold.worker.task")

#: The plugin's input document, in its working directory, when the scope came in pages.
INPUT_FILE = ".leasehold-input.json"

EndingKind = Literal["exited", "invalid_output", "deadline", "cancelled", "lost", "shutdown", "rejected", "crashed"]


@dataclass(frozen=True, slots=True)
class Ending:
    """Why the attempt is ending; the first one reported wins."""

    kind: EndingKind
    detail: str = ""
    exit_code: int | None = None


class Carry(Protocol):
    """How a runner carries the agent's next acquire on its ending write (complete or fail)."""

    def ask(self) -> AcquireMore | None:
        """The acquire to carry (None: carry none); called just before the write is sent."""

    def granted(self, leases: list[Lease], timing: AcquireTiming) -> None:
        """What the carried acquire granted; called once after every :meth:`ask` that carried one
        (with no leases when the write failed)."""


@dataclass(frozen=True, slots=True)
class AcquireTiming:
    """When (monotonic) the acquire that returned this lease was first sent and answered."""

    first_sent: float
    received: float
    retried: bool
    request_id: str = ""

    @property
    def base(self) -> float:
        """The latest local instant surely not after the Gateway created the lease."""
        return self.first_sent if self.retried else self.received


class TaskRunner:
    """Runs one lease to its end; :meth:`run` returns the outcome (completed, failed, timeout, cancelled, lost)."""

    def __init__(self, lease: Lease, timing: AcquireTiming, *, client: GatewayClient,
                 settings: WorkerSettings, resolver: PluginResolver, status: Status,
                 carry: Carry | None = None) -> None:
        self.lease, self.client, self.settings, self.resolver, self.status = lease, client, settings, resolver, status
        self.carry = carry
        self.task = lease.task
        self.attempt = AttemptRef(lease.task.id, lease.attempt_id, lease.lease_token)
        self.plugin: PluginProcess | None = None
        leased_at = lease.attempt.leased_at
        lease_span = max(0.0, (lease.lease_expires_at - leased_at).total_seconds())
        timeout = max(0.0, (lease.deadline_at - leased_at).total_seconds())
        self._timing = timing
        self._lease_valid_until = timing.base + lease_span
        self._deadline_hard = timing.base + timeout
        # Start stopping the plugin early enough (SIGTERM, then SIGKILL after the grace) that it is
        # gone by the Gateway's deadline.
        self._safety = min(settings.kill_grace_seconds + 1.0, 0.25 * timeout)
        self._deadline = self._deadline_hard - self._safety
        self._endings: asyncio.Queue[Ending] = asyncio.Queue()
        self._final_acked = asyncio.Event()
        self._completed = False  # the Gateway completed the attempt with its final batch
        #: The completion is on its way: no renewal starts (one would reach the Gateway after it,
        #: and be refused as a write on a finished attempt).
        self._closing = False
        self._renewal_idle = asyncio.Event()  # set while no renewal is in flight
        self._renewal_idle.set()
        self._error_records: list[dict[str, Any]] = []
        self._started = time.monotonic()
        self._background: list[asyncio.Task[Any]] = []
        self._cancel_notified = False
        self.log_fields = {"task_id": str(self.task.id), "attempt_id": str(lease.attempt_id),
                        "task_type": self.task.task_type, "attempt": lease.attempt.attempt_number}

    # --- signals from the agent ---------------------------------------------------------------

    @property
    def cancel_notified(self) -> bool:
        return self._cancel_notified

    def request_cancel(self, source: str) -> bool:
        """The Gateway said (in an acquire answer) that this task is being cancelled; False when
        it had said so before."""
        if self._cancel_notified:
            return False
        self._cancel_notified = True
        self._end(Ending("cancelled", f"cancel requested ({source})"))
        return True

    def abort(self, reason: str) -> None:
        """The worker is shutting down and the grace period is over."""
        self._end(Ending("shutdown", reason))

    def kill_now(self) -> None:
        """The worker exits at once: SIGKILL the plugin, write nothing."""
        if self.plugin is not None:
            self.plugin.kill_now()

    # --- the lifecycle ------------------------------------------------------------------------

    def lease_alive(self) -> bool:
        return time.monotonic() < self._lease_valid_until

    async def run(self) -> str:
        self.status.task_started(RunningTask(self.task.id, self.attempt.attempt_id, self.task.task_type,
                                             self.lease.attempt.attempt_number))
        outcome = "lost"
        try:
            outcome = await self._run()
        except Exception:
            log.exception("task runner crashed", extra=self.log_fields)
            outcome = "lost"
        finally:
            for task in self._background:
                task.cancel()
            for task in self._background:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if self.plugin is not None:
                await self.plugin.close()
            self.status.task_finished(self.attempt.attempt_id, outcome)
        return outcome

    async def _run(self) -> str:
        try:
            command = self.resolver.resolve(self.task.task_type)
        except PluginNotFound as exc:
            return await self._fail(str(exc), retryable=True)
        # The target policy, again here, with the names resolved by this host: what the Gateway
        # checked at creation may resolve elsewhere now (or from here). No plugin runs then.
        refused = await refused_target(self.task.scope, self.lease.target_policy.model_dump())
        if refused is not None:
            log.warning("target refused by the target policy",
                        extra={**self.log_fields, "reason": refused.message})
            return await self._fail(f"target policy: {refused.message}", retryable=False)
        workdir = Path(tempfile.mkdtemp(prefix=f"leasehold-{self.task.task_type}-"))
        try:
            return await self._run_plugin(command, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    async def _run_plugin(self, command: PluginCommand, workdir: Path) -> str:
        # The lease is renewed, and the deadline watched, from here: reading a large scope takes
        # a while before the plugin starts.
        self._spawn(self._renew())
        self._spawn(self._watch_deadline())
        document: bytes | Path
        ref = self.task.scope_ref
        if ref is None or ref.pages <= 1:  # the lease carried the whole scope
            document = orjson.dumps({"scope": self.task.scope, "parameters": self.task.parameters})
        else:
            self.status.task_phase(self.attempt.attempt_id, "reading scope")
            read = await self._first(self._read_scope(ref, workdir / INPUT_FILE),
                                     kinds=("cancelled", "lost", "deadline", "shutdown", "crashed"))
            if read is not None:
                return await self._stop_and_report(None, read)
            document = workdir / INPUT_FILE
        env = {**os.environ, "LEASEHOLD_TASK_ID": str(self.task.id),
               "LEASEHOLD_ATTEMPT_ID": str(self.attempt.attempt_id),
               "LEASEHOLD_ATTEMPT_NUMBER": str(self.lease.attempt.attempt_number),
               "LEASEHOLD_TASK_TYPE": self.task.task_type}
        try:
            self.plugin = await PluginProcess.start(
                command, document, cwd=workdir, env=env, max_line_bytes=self.settings.max_record_bytes,
                on_stderr_line=self._stderr_line)
        except OSError as exc:
            return await self._fail(f"plugin {' '.join(command.argv)} could not be started: {exc}",
                                    retryable=True)
        plugin = self.plugin
        log.info("plugin started", extra={**self.log_fields, "pid": plugin.pid, "plugin": command.source})
        self.status.task_phase(self.attempt.attempt_id, "running", pid=plugin.pid)
        batcher = Batcher(self.attempt.attempt_id, max_records=self.settings.batch_records,
                          max_seconds=self.settings.batch_seconds, max_bytes=self.settings.batch_bytes)
        pump = self._spawn(self._pump(plugin, batcher))
        sender = self._spawn(self._send(batcher))
        timer = self._spawn(batcher.run_timer())

        ending = await self._endings.get()
        if ending.kind == "exited" and ending.exit_code == 0 and not self._error_records:
            self.status.task_phase(self.attempt.attempt_id, "submitting")
            interrupted = await self._first(self._finish(batcher),
                                            kinds=("cancelled", "lost", "rejected", "crashed"))
            if interrupted is None:
                return await self._complete(batcher)
            ending = interrupted
        for task in (pump, timer, sender):
            task.cancel()  # nothing more is submitted for this attempt
        return await self._stop_and_report(plugin, ending)

    async def _read_scope(self, ref: ScopeRefView, path: Path) -> None:
        """Write the plugin's input document to ``path``, the scope's pages read from the Gateway
        one by one and appended as they arrive (memory holds one page), then check that every
        asset of the scope arrived. A refusal, or a scope that is not whole, ends the attempt."""
        assembler = ScopeAssembler(self.task.scope)
        started = time.monotonic()
        try:
            with path.open("wb") as out:
                out.write(b'{"scope":' + assembler.start())
                for number in range(1, ref.pages):
                    page = await self.client.scope_page(self.attempt, number, retry_while=self.lease_alive)
                    if page.page != number or page.pages != ref.pages:
                        raise ScopeMismatch(f"asked for page {number} of {ref.pages}, got page {page.page} of "
                                            f"{page.pages}")
                    out.write(assembler.add(page.assets))
                out.write(assembler.finish() + b',"parameters":' + orjson.dumps(self.task.parameters) + b"}")
            assembler.check(ScopeRef(ref.sha256, ref.bytes, ref.assets, ref.pages))
        except TaskWasCancelled as exc:
            self._end(Ending("cancelled", f"the Gateway refused to hand out the scope: {exc.detail}"))
        except LeaseLost as exc:
            self._end(Ending("lost", exc.detail))
        except GatewayUnavailable as exc:
            self._end(Ending("lost", f"the lease expired while the Gateway was unreachable: {exc}"))
        except (GatewayError, ScopeMismatch, OSError) as exc:
            self._end(Ending("crashed", f"the task's scope could not be read: {exc}"))
        else:
            log.info("scope read", extra={**self.log_fields, "pages": ref.pages, "assets": assembler.assets,
                                          "bytes": assembler.size, "seconds": round(time.monotonic() - started, 2)})
            return
        await asyncio.Event().wait()  # the ending reported above ends the attempt

    async def _finish(self, batcher: Batcher) -> None:
        await batcher.finish()
        await self._final_acked.wait()

    async def _before_completion(self) -> None:
        """No renewal starts from here, and one in flight is answered before the completion is
        sent (sent after it, it would be refused as a write on a finished attempt)."""
        self._closing = True
        await self._renewal_idle.wait()

    async def _complete(self, batcher: Batcher) -> str:
        try:
            if not self._completed:  # (the final batch normally carried the completion)
                await self._before_completion()
                await self._carrying(lambda acquire: self.client.complete(
                    self.attempt, acquire=acquire, retry_while=self.lease_alive))
        except TaskWasCancelled:
            return await self._acknowledge_cancel("cancelled before completion")
        except GatewayError as exc:
            return self._lost(f"complete failed: {exc}")
        log.info("task completed", extra={**self.log_fields, "records": batcher.records_total,
                                          "batches": batcher.batches_cut, "seconds": self._elapsed()})
        return "completed"

    async def _stop_and_report(self, plugin: PluginProcess | None, ending: Ending) -> str:
        """Stop the plugin if it still runs (None: it never started), then make the one write this
        ending calls for."""
        if plugin is not None and plugin.process.returncode is None:
            self.status.task_phase(self.attempt.attempt_id, "stopping")
            code = await plugin.stop(self.settings.kill_grace_seconds)
            log.info("plugin stopped", extra={**self.log_fields, "pid": plugin.pid, "exit_code": code,
                                              "reason": ending.kind})
        if ending.kind == "cancelled":
            return await self._acknowledge_cancel(ending.detail)
        if ending.kind == "lost":
            return self._lost(ending.detail)
        if ending.kind == "exited" and plugin is not None:
            error, retryable = self._exit_error(plugin, ending.exit_code)
            return await self._fail(error, retryable=retryable)
        if ending.kind == "invalid_output" and plugin is not None:
            return await self._fail(f"invalid output from plugin {self.task.task_type}: {ending.detail}; "
                                    f"plugin stopped{self._stderr_suffix(plugin)}", retryable=True)
        if ending.kind == "deadline":
            # The deadline is the Gateway's policy limit: it ends the attempt as a timeout itself
            # (terminal, job ``timeout``). A ``fail`` sent now would arrive before the deadline and
            # turn the timeout into a retried failure, so nothing more is written.
            log.warning("execution deadline reached; plugin stopped, the Gateway ends the attempt as a timeout",
                        extra={**self.log_fields, "seconds": self._elapsed(),
                               "execution_timeout_seconds": self.task.execution_timeout_seconds,
                               "stderr": self._stderr_suffix(plugin)})
            return "timeout"
        if ending.kind == "shutdown":
            return await self._fail(f"worker shutting down: plugin {self.task.task_type} stopped after "
                                    f"{self._elapsed()}s before it finished ({ending.detail})", retryable=True)
        if ending.kind == "crashed":
            doing = "running" if plugin is not None else "preparing"
            return await self._fail(f"worker error while {doing} plugin {self.task.task_type}: {ending.detail}",
                                    retryable=True)
        return await self._fail(f"the Gateway refused a write of this attempt: {ending.detail}", retryable=True)

    # --- the concurrent parts -------------------------------------------------------------------

    async def _pump(self, plugin: PluginProcess, batcher: Batcher) -> None:
        try:
            async for record, size in plugin.records():
                if record["type"] == "error":
                    self._error_records.append(record)
                    continue
                await batcher.add(record, size)
                self.status.task_records(self.attempt.attempt_id, batcher.records_total)
        except InvalidOutput as exc:
            self._end(Ending("invalid_output", str(exc)))
            return
        code = await plugin.wait()
        self._end(Ending("exited", exit_code=code))

    async def _send(self, batcher: Batcher) -> None:
        """``progress`` first, then every batch in order, each until acknowledged."""
        try:
            await self.client.progress(self.attempt, retry_while=self.lease_alive)
            while True:
                batch = await batcher.outbox.get()
                if batch.final:  # the last batch travels with complete: one request, one transaction
                    await self._before_completion()
                    await self._carrying(functools.partial(
                        self._complete_with, batch))
                    self._completed = True
                    log.info("final result batch accepted with the completion", extra={
                        **self.log_fields, "sequence_number": batch.sequence_number,
                        "records": batch.record_count})
                    self._final_acked.set()
                    return
                ack = await self.client.submit(
                    self.attempt, sequence_number=batch.sequence_number, idempotency_key=batch.idempotency_key,
                    payload_sha256=batch.payload_sha256, payload=batch.payload, final=False,
                    retry_while=self.lease_alive)
                log.info("result batch accepted", extra={
                    **self.log_fields, "sequence_number": batch.sequence_number, "records": batch.record_count,
                    "final": False, "duplicate": ack.duplicate})
        except TaskWasCancelled as exc:
            self._end(Ending("cancelled", f"the Gateway refused a write: {exc.detail}"))
        except LeaseLost as exc:
            self._end(Ending("lost", exc.detail))
        except GatewayUnavailable as exc:
            self._end(Ending("lost", f"the lease expired while the Gateway was unreachable: {exc}"))
        except Rejected as exc:
            self._end(Ending("rejected", str(exc)))
        except GatewayError as exc:
            self._end(Ending("crashed", str(exc)))

    async def _renew(self) -> None:
        interval = max(0.2, self.task.lease_seconds / 3)
        next_at = time.monotonic() if self._timing.retried else self._timing.received + interval
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if self._closing:
                return
            sent = time.monotonic()
            self._renewal_idle.clear()
            try:
                answer = await self.client.renew(self.attempt, retry_while=self.lease_alive)
            except TaskWasCancelled as exc:
                self._end(Ending("cancelled", f"renewal refused: {exc.detail}"))
                return
            except LeaseLost as exc:
                self._end(Ending("lost", f"renewal refused: {exc.detail}"))
                return
            except GatewayUnavailable as exc:
                self._end(Ending("lost", f"the lease expired while the Gateway was unreachable: {exc}"))
                return
            except Rejected as exc:
                self._end(Ending("lost", f"renewal refused: {exc}"))
                return
            except GatewayError as exc:
                self._end(Ending("crashed", str(exc)))
                return
            finally:
                self._renewal_idle.set()
            if answer.cancel_requested:
                self._end(Ending("cancelled", "cancel requested (lease renewal)"))
                return
            self._lease_valid_until = min(sent + self.task.lease_seconds, self._deadline_hard)
            next_at = sent + interval

    async def _watch_deadline(self) -> None:
        await asyncio.sleep(max(0.0, self._deadline - time.monotonic()))
        self._end(Ending("deadline"))

    # --- endings --------------------------------------------------------------------------------

    def _end(self, ending: Ending) -> None:
        self._endings.put_nowait(ending)

    async def _first(self, work: Awaitable[None], *, kinds: tuple[str, ...]) -> Ending | None:
        """Run ``work``; return None when it finishes first, else the first ending of ``kinds``."""
        job = asyncio.ensure_future(work)
        try:
            while True:
                getter = asyncio.ensure_future(self._endings.get())
                done, _ = await asyncio.wait({job, getter}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    ending = getter.result()
                    if ending.kind in kinds:
                        return ending
                    if job not in done:
                        continue
                else:
                    getter.cancel()
                job.result()
                return None
        finally:
            job.cancel()

    async def _complete_with(self, batch: Batch, acquire: AcquireMore | None) -> list[Lease]:
        return await self.client.complete(self.attempt, final_batch=batch, acquire=acquire,
                                          retry_while=self.lease_alive)

    async def _carrying(self, write: Callable[[AcquireMore | None], Awaitable[list[Lease]]]) -> None:
        """Send the attempt's ending ``write``, carrying the agent's next acquire when it has one
        to carry; the leases it granted go to the agent (none when the write failed)."""
        acquire = self.carry.ask() if self.carry is not None else None
        if acquire is None:
            await write(None)
            return
        sent, leases = time.monotonic(), []
        try:
            leases = await write(acquire)
        finally:
            assert self.carry is not None
            # retried=True: the leases' durations count from when the write was first sent (safe).
            self.carry.granted(leases, AcquireTiming(sent, time.monotonic(), True, acquire.request_id or ""))

    async def _fail(self, error: str, *, retryable: bool) -> str:
        self.status.task_phase(self.attempt.attempt_id, "failing")
        try:
            await self._carrying(lambda acquire: self.client.fail(
                self.attempt, error=error, retryable=retryable, acquire=acquire, retry_while=self.lease_alive))
        except TaskWasCancelled:
            return await self._acknowledge_cancel("cancelled while failing")
        except GatewayError as exc:
            return self._lost(f"fail could not be reported: {exc}")
        log.warning("task failed", extra={**self.log_fields, "error": error, "retryable": retryable,
                                          "seconds": self._elapsed()})
        return "failed"

    async def _acknowledge_cancel(self, reason: str) -> str:
        self.status.task_phase(self.attempt.attempt_id, "cancelling")
        try:
            await self.client.cancel_ack(self.attempt, retry_while=self.lease_alive)
        except GatewayError as exc:
            # The Gateway ends an unacknowledged cancellation itself (lease expiry or grace).
            log.warning("cancel acknowledgement failed", extra={**self.log_fields, "error": str(exc)})
        log.info("task cancelled", extra={**self.log_fields, "reason": reason, "seconds": self._elapsed()})
        return "cancelled"

    def _lost(self, reason: str) -> str:
        log.warning("lease lost; attempt abandoned", extra={**self.log_fields, "reason": reason})
        return "lost"

    def _exit_error(self, plugin: PluginProcess, code: int | None) -> tuple[str, bool]:
        name = self.task.task_type
        how = f"exited with code {code}"
        if code is not None and code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        retryable = code != EXIT_BAD_INPUT
        if self._error_records:
            first = self._error_records[0]
            message = str(first.get("message") or first.get("error") or "no message")
            retryable = retryable and all(r.get("retryable", True) is not False for r in self._error_records)
            text = f"plugin {name} reported an error: {message} (it {how})"
        elif code == EXIT_BAD_INPUT:
            text = f"plugin {name} rejected its input (exit code {EXIT_BAD_INPUT}: bad input)"
        else:
            text = f"plugin {name} {how}"
        return text + self._stderr_suffix(plugin), retryable

    @staticmethod
    def _stderr_suffix(plugin: PluginProcess | None) -> str:
        if plugin is None:
            return "; the plugin had not started"
        tail = plugin.stderr_tail()
        return f"; stderr tail:\n{tail}" if tail else "; no stderr output"

    def _stderr_line(self, line: str) -> None:
        if line:
            log.debug("plugin stderr", extra={**self.log_fields, "line": line[:2000]})

    def _spawn(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(self._guarded(work))
        self._background.append(task)
        return task

    async def _guarded(self, work: Awaitable[Any]) -> None:
        """A part that fails unexpectedly ends the attempt (instead of dying unnoticed)."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("task part crashed", extra=self.log_fields)
            self._end(Ending("crashed", f"{type(exc).__name__}: {exc}"))

    def _elapsed(self) -> float:
        return round(time.monotonic() - self._started, 1)
