"""The worker agent: the acquire loop, concurrency, cancellation notices and shutdown.

One acquirer long-polls the Gateway while fewer than ``max_concurrency`` tasks run; each lease
gets a :class:`~worker.runner.TaskRunner`.

* **Several tasks per request** (``acquire_many``, on by default). An acquire asks for every
  slot free at that moment (``max_tasks``), and each task's ending write (complete or fail)
  carries the next acquire, for its own slot and every other free one: a busy worker makes
  about one request per task beyond the task's own writes. Off, every acquire asks for one
  task, as the Gateway's first protocol version did.

* **Acquire retries.** Every acquire has a fresh ``request_id``; after a network error or a
  5xx the *same* acquire is retried with the *same* ``request_id``, so an answer lost on the way
  back returns the same attempt instead of leasing a second task. Retries back off
  exponentially with full jitter; the loop never spins (a 204 that comes back faster than the
  long-poll should, or an answer carrying only cancellations we already act on, waits too).
* **Cancellation.** An acquire answer lists the attempts of this worker whose tasks are being
  cancelled; their runners stop the plugin and acknowledge. (Renewals say so too.)
* **Shutdown.** The first SIGTERM/SIGINT stops acquiring and gives running plugins
  ``shutdown_grace_seconds`` to finish; the ones still running then are stopped and failed as
  retryable, and :meth:`Agent.run` returns 0. A second signal kills the plugins and exits at
  once (status 1); their leases expire and the Gateway retries the tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import uuid
from uuid import UUID

from leasehold.protocol.wire import MAX_TASKS_PER_ACQUIRE, AcquireMore, AcquireResponse, CancelNotice, Lease
from leasehold.worker.backoff import Backoff, sleep_unless
from leasehold.worker.client import (
    GatewayClient,
    InvalidAnswer,
    Rejected,
    Stopped,
    leases_of,
)
from leasehold.worker.plugin import PluginResolver
from leasehold.worker.runner import AcquireTiming, TaskRunner
from leasehold.worker.settings import WorkerSettings
from leasehold.worker.status import Status

__all__ = ["Agent", "ConfigurationError", "EXIT_INTERRUPTED"]

log = logging.getLogger("leasehold.worker")

EXIT_INTERRUPTED = 1
#: A 204 this much faster than the long-poll asked for means the Gateway does not long-poll.
_FAST_EMPTY_FRACTION = 0.5


class ConfigurationError(Exception):
    """The worker cannot start with these settings."""


class Agent:
    """Run with ``await Agent(settings).run()``; stop with :meth:`request_stop`."""

    def __init__(self, settings: WorkerSettings, *, status: Status | None = None) -> None:
        self.settings = settings
        self.status = status or Status(settings.max_concurrency)
        self.resolver = PluginResolver(settings.plugins_dir, settings.capabilities)
        self.runners: dict[UUID, TaskRunner] = {}
        self._tasks: set[asyncio.Task[str]] = set()
        self._stopping: asyncio.Event | None = None
        self._signals = 0
        self._unknown_cancels: set[UUID] = set()
        self._slots = Slots(settings.max_concurrency)
        #: Several tasks per request: the setting, until a Gateway refuses the fields (an older one).
        self._many = settings.acquire_many

    # --- control ------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop acquiring; let running tasks finish within the grace period (first signal)."""
        if self._stopping is not None and not self._stopping.is_set():
            log.info("shutting down: no new tasks; waiting for running ones",
                     extra={"running": len(self.runners), "grace_seconds": self.settings.shutdown_grace_seconds})
            self.status.shutting_down()
            self._stopping.set()

    def kill_now(self) -> None:
        """SIGKILL every plugin process group (second signal), without any Gateway write."""
        for runner in list(self.runners.values()):
            runner.kill_now()

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info("signal received", extra={"signal": signal.Signals(signum).name})
            self.request_stop()
            return
        log.warning("second signal: exiting at once", extra={"signal": signal.Signals(signum).name})
        self.kill_now()
        logging.shutdown()
        os._exit(EXIT_INTERRUPTED)

    # --- main loop ----------------------------------------------------------------------------

    async def run(self, *, handle_signals: bool = False) -> int:
        """Serve until :meth:`request_stop` (or SIGTERM/SIGINT with ``handle_signals``); exit code."""
        missing = self.resolver.missing()
        if missing:
            raise ConfigurationError(f"no plugin for capabilities {', '.join(missing)} "
                                     f"(built-in: {', '.join(sorted(self.resolver.available()))})")
        self._stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        if handle_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self._on_signal, signum)
        log.info("worker starting", extra={
            "gateway": self.settings.gateway, "max_concurrency": self.settings.max_concurrency,
            "task_types": ",".join(self.resolver.offered()),
            "plugins_dir": str(self.settings.plugins_dir) if self.settings.plugins_dir else None})
        health = None
        if self.settings.health_port is not None:
            from leasehold.worker.health import HealthServer

            health = HealthServer(self.status, self.settings.health_port)
            log.info("health and metrics", extra={"url": f"http://127.0.0.1:{await health.start()}"})
        try:
            async with GatewayClient(self.settings) as client:
                acquirer = asyncio.create_task(self._acquire_loop(client))
                stopping = asyncio.create_task(self._stopping.wait())
                await asyncio.wait({acquirer, stopping}, return_when=asyncio.FIRST_COMPLETED)
                crashed = acquirer.done() and not acquirer.cancelled() and acquirer.exception() is not None
                if crashed:
                    log.error("acquire loop crashed", exc_info=acquirer.exception())
                acquirer.cancel()
                stopping.cancel()
                for task in (acquirer, stopping):
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                await self._drain()
        finally:
            if health is not None:
                await health.stop()
            if handle_signals:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
        log.info("worker stopped", extra=self.status.summary())
        return 1 if crashed else 0

    async def _drain(self) -> None:
        """Give running tasks the grace period, then stop the rest (failed as retryable)."""
        if not self._tasks:
            return
        grace = self.settings.shutdown_grace_seconds
        _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
        if not pending:
            return
        log.warning("grace period over: stopping running plugins", extra={"running": len(pending)})
        for runner in list(self.runners.values()):
            runner.abort(f"shutdown grace of {grace:g}s exceeded")
        # Stopping a plugin takes up to kill_grace; reporting the failure up to a request timeout.
        limit = self.settings.kill_grace_seconds + self.settings.request_timeout_seconds + 5
        _, pending = await asyncio.wait(pending, timeout=limit)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def _acquire_loop(self, client: GatewayClient) -> None:
        assert self._stopping is not None
        slots = self._slots = Slots(self.settings.max_concurrency)
        idle = Backoff(0.5, 5.0)  # answers that carry nothing new: wait, do not spin
        while not self._stopping.is_set():
            await slots.take()
            # One slot waited for, and every other one free now: one request asks for them all.
            asked = 1 + slots.take_free(self._batch_limit() - 1) if self._many else 1
            try:
                answer, timing, waited = await self._acquire(client, asked if self._many else None)
            except BaseException:
                slots.give(asked)
                raise
            news = self._on_cancel_notices(answer.cancel_requested)
            leases = leases_of(answer)[:asked]
            slots.give(asked - len(leases))
            if not leases:
                elapsed = timing.received - timing.first_sent
                if answer.cancel_requested and not news:
                    # The Gateway repeats a cancellation until it is acknowledged; we act on it already.
                    await sleep_unless(self._stopping, idle.next_delay())
                elif not answer.cancel_requested and elapsed < waited * _FAST_EMPTY_FRACTION:
                    await sleep_unless(self._stopping, idle.next_delay())
                else:
                    idle.reset()
                continue
            idle.reset()
            for lease in leases:
                self._start(client, lease, timing)

    def _batch_limit(self) -> int:
        """The most tasks one acquire asks for."""
        return min(self.settings.max_concurrency, MAX_TASKS_PER_ACQUIRE)

    def _start(self, client: GatewayClient, lease: Lease, timing: AcquireTiming) -> None:
        """Run ``lease`` in a slot already taken for it; the slot is given back when it ends
        (unless a lease its ending write carried took it over)."""
        carry = _Carry(self, client, lease.attempt_id) if self._many else None
        runner = TaskRunner(lease, timing, client=client, settings=self.settings, resolver=self.resolver,
                            status=self.status, carry=carry)
        log.info("task acquired", extra={**runner.log_fields, "lease_seconds": lease.task.lease_seconds,
                                         "execution_timeout_seconds": lease.task.execution_timeout_seconds,
                                         "request_id": timing.request_id, "acquire_retried": timing.retried})
        self.runners[lease.attempt_id] = runner
        task = asyncio.create_task(runner.run(), name=f"task-{lease.task.id}")
        self._tasks.add(task)

        def finished(done: asyncio.Task[str], attempt_id: UUID = lease.attempt_id) -> None:
            self._tasks.discard(done)
            self.runners.pop(attempt_id, None)
            if carry is None or not carry.passed:
                self._slots.give()

        task.add_done_callback(finished)

    async def _acquire(self, client: GatewayClient,
                       max_tasks: int | None = None) -> tuple[AcquireResponse, AcquireTiming, int]:
        """One acquire (long-poll), retried with one request id until answered."""
        assert self._stopping is not None
        wait = self.settings.wait_seconds
        rejected = Backoff(self.settings.backoff_initial_seconds * 4, max(self.settings.backoff_max_seconds, 5.0))
        while True:
            request_id = uuid.uuid4().hex
            first_sent = time.monotonic()
            retried = False

            def on_retry(reason: str, delay: float, request_id: str = request_id) -> None:
                nonlocal retried
                retried = True
                self.status.gateway_unreachable(reason)
                log.warning("gateway unreachable; retrying acquire (same request id)",
                            extra={"error": reason, "retry_in": round(delay, 2), "request_id": request_id})

            try:
                answer = await client.acquire(request_id, wait_seconds=wait, stop=self._stopping,
                                              known_cancels=self._known_cancels(),
                                              on_retry=on_retry, max_tasks=max_tasks)
            except Stopped:
                raise asyncio.CancelledError from None
            except InvalidAnswer as exc:
                delay = rejected.next_delay()
                self.status.gateway_unreachable("unexpected answer")
                log.error("unexpected acquire answer; retrying", extra={"error": str(exc), "retry_in": round(delay, 2)})
                if await sleep_unless(self._stopping, delay):
                    raise asyncio.CancelledError from None
                continue
            except Rejected as exc:
                if exc.status == 422 and max_tasks is not None:
                    # A Gateway older than max_tasks refuses the field: one task per request from now on.
                    log.warning("the Gateway does not take several tasks per request; acquiring one at a time",
                                extra={"error": exc.detail})
                    self._many = False
                    return await self._acquire(client, None)
                if exc.status == 409:
                    # The lease this request id created has ended already: ask anew.
                    log.info("acquire request id expired; using a new one", extra={"request_id": request_id})
                    continue
                delay = rejected.next_delay()
                self.status.gateway_unreachable(str(exc))
                log.error("the Gateway refused to lease tasks to this worker",
                          extra={"status": exc.status, "error": exc.detail, "retry_in": round(delay, 2)})
                if await sleep_unless(self._stopping, delay):
                    raise asyncio.CancelledError from None
                continue
            self.status.gateway_reachable()
            return answer, AcquireTiming(first_sent, time.monotonic(), retried, request_id), wait

    def _known_cancels(self) -> list[UUID]:
        """Attempts whose cancellation this process already acts on (the Gateway need not repeat them)."""
        return [*(a for a, r in self.runners.items() if r.cancel_notified), *self._unknown_cancels]

    def _on_cancel_notices(self, notices: list[CancelNotice]) -> bool:
        """Tell the runners concerned; True when a notice was news to one of them."""
        new = False
        for notice in notices:
            runner = self.runners.get(notice.attempt_id)
            if runner is not None:
                new = runner.request_cancel("acquire answer") or new
            elif notice.attempt_id not in self._unknown_cancels:
                self._unknown_cancels.add(notice.attempt_id)
                log.warning("cancellation for an attempt this process does not run (an earlier run of this "
                            "worker?); the Gateway ends it after its grace period",
                            extra={"task_id": str(notice.task_id), "attempt_id": str(notice.attempt_id)})
        return new


class Slots:
    """The agent's free task slots: one acquire loop waits for one, a runner's ending takes every
    free one at once for the acquire it carries."""

    def __init__(self, count: int) -> None:
        self.free = count
        self._changed = asyncio.Event()

    async def take(self) -> None:
        """Take one slot, waiting for it."""
        while self.free == 0:
            self._changed.clear()
            await self._changed.wait()
        self.free -= 1

    def take_free(self, most: int) -> int:
        """Take up to ``most`` slots that are free now (never waits); how many."""
        taken = max(0, min(most, self.free))
        self.free -= taken
        return taken

    def give(self, count: int = 1) -> None:
        if count > 0:
            self.free += count
            self._changed.set()


class _Carry:
    """The acquire one runner's ending write carries (see :class:`worker.runner.Carry`): the
    runner's own slot, which its ending frees, and every slot free at that moment; the leases
    granted start in them (the first takes the runner's slot over), and the slots left unused
    are given back."""

    def __init__(self, agent: Agent, client: GatewayClient, attempt_id: UUID) -> None:
        self.agent, self.client, self.attempt_id = agent, client, attempt_id
        self.extra = 0
        #: A carried lease took the runner's slot: its ending must not give it back.
        self.passed = False

    def ask(self) -> AcquireMore | None:
        stopping = self.agent._stopping
        if stopping is None or stopping.is_set() or not self.agent._many:
            return None
        self.extra = self.agent._slots.take_free(self.agent._batch_limit() - 1)
        return AcquireMore(max_tasks=1 + self.extra, request_id=uuid.uuid4().hex)

    def granted(self, leases: list[Lease], timing: AcquireTiming) -> None:
        leases = leases[:1 + self.extra]
        stopping = self.agent._stopping
        if leases and (stopping is None or stopping.is_set()):
            # Granted while the agent began to stop: not started (their leases lapse and the
            # Gateway retries the tasks).
            log.warning("leases granted while stopping are left to expire", extra={"leases": len(leases)})
            leases = []
        self.agent._slots.give(self.extra - max(0, len(leases) - 1))
        self.extra = 0
        if not leases:
            return
        self.passed = True
        # The runner's attempt has ended (its write was answered): it no longer counts as running.
        self.agent.runners.pop(self.attempt_id, None)
        for lease in leases:
            self.agent._start(self.client, lease, timing)
