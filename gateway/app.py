"""The Gateway application: ``create_app(settings)`` wires everything.

The pool and the services built on it (:func:`gateway.services.build_services`, once per
process), the LISTEN connection, the optional Redis hints, the sweeper, the scheduler, the
checkpointer, the metrics sampler and the worker presence publisher live in ``cleanup_ctx``
(started before serving, cancelled and awaited on shutdown). Routes come from the API modules' route tables, which the OpenAPI
document is generated from as well.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

from aiohttp import web
from prometheus_client import Counter, Gauge
from psycopg_pool import AsyncConnectionPool

from leasehold.domain.retry import RetryPolicy
from leasehold.gateway import health
from leasehold.gateway.api import operator as operator_api
from leasehold.gateway.api import service as service_api
from leasehold.gateway.api import worker as worker_api
from leasehold.gateway.api.http import (
    Route,
    error_middleware,
    listener_middleware,
    listeners_of,
    request_log_middleware,
)
from leasehold.gateway.background import (
    bulk,
    checkpointer,
    partitioner,
    presence,
    sampler,
    scheduler,
    sweeper,
    webhooks,
)
from leasehold.gateway.background.hints import Hints
from leasehold.gateway.background.notify import Notifier
from leasehold.gateway.background.waitroom import WaitRoom, run_sweep
from leasehold.gateway.console.site import routes as console_routes
from leasehold.gateway.identity import FailureBudgets, KnownCertificates, TokenBuckets
from leasehold.gateway.keys import (
    AUTH_FAILURES,
    BUCKETS,
    CERTIFICATES,
    HINTS,
    METRICS,
    NOTIFIER,
    OBSERVE_REQUEST,
    PRESENCE,
    READ_DATABASE,
    ROUTE_LISTENERS,
    ROUTES,
    SEALER,
    SERVICES,
    SETTINGS,
)
from leasehold.gateway.metrics import Metrics
from leasehold.gateway.presence import Presence
from leasehold.gateway.schema import expected_revision
from leasehold.gateway.services import build_services
from leasehold.gateway.settings import GatewaySettings
from leasehold.gateway.startup import check_databases
from leasehold.persistence.connection import create_pool
from leasehold.persistence.roles import privilege_warnings
from leasehold.persistence.seals import Sealer, load_private_key, open_sink
from leasehold.persistence.transaction import Database

log = logging.getLogger("leasehold.gateway")

#: How long stopping waits for the background loops once they are cancelled.
LOOP_STOP_SECONDS = 5.0
#: How long stopping waits for the last publish of worker presence.
PRESENCE_STOP_SECONDS = 1.0


async def _resources(app: web.Application) -> AsyncIterator[None]:
    settings, metrics = app[SETTINGS], app[METRICS]
    url = settings.resolved_database_url()
    # Unreachable, or at another schema revision than this Gateway's: refuse to start (one line).
    await check_databases(settings)
    notifier = Notifier(settings.notify_url(), room=WaitRoom(batch=settings.wake_batch))
    hints = None
    if settings.redis_url:
        hints = Hints(settings.redis_url, notifier.dispatch, registry=metrics.registry)
        app[HINTS] = hints
    pool = create_pool(url, min_size=2, max_size=settings.pool_size, prepare=settings.prepared_statements)
    await pool.open(wait=False)
    read_pool = None
    if settings.read_database_url:
        read_pool = create_pool(settings.read_database_url, min_size=1, max_size=settings.pool_size,
                                prepare=settings.prepared_statements)
        await read_pool.open(wait=False)
    # The topics a committed transaction NOTIFYed also go to Redis, when it is configured.
    db = Database(pool, on_commit=hints.publish if hints is not None else None)
    failures = Counter("leasehold_schedule_failures_total",
                       "Due schedules whose scan could not be created (rolled back and backed off)",
                       registry=metrics.registry)
    services = build_services(db, cancel_grace=timedelta(seconds=settings.cancel_grace_seconds),
                              observe=metrics.count_events, on_schedule_failure=lambda _: failures.inc(),
                              fair_shares=settings.fair_shares)
    services.lifecycle.observe_cancel = metrics.observe_cancel
    services.schedules.on_admission_refused = lambda: metrics.refused_admission("scan")
    app[SERVICES] = services
    app[READ_DATABASE] = Database(read_pool) if read_pool is not None else db
    # A lost LISTEN connection means the database went away: once it is back, drop the pool's
    # dead idle connections at once, rather than letting requests find them one by one.
    notifier.on_reconnect = pool.check
    if settings.listen:
        notifier.start()
    app[NOTIFIER] = notifier
    Gauge("leasehold_listen_connected", "1 while the LISTEN connection is up",
          registry=metrics.registry).set_function(lambda: 1 if notifier.connected.is_set() else 0)
    Gauge("leasehold_long_polls_waiting", "Acquire long-polls waiting for a wake-up",
          registry=metrics.registry).set_function(lambda: notifier.waiting)
    for stat, what in (("pool_size", "connections open"), ("pool_available", "connections idle in the pool"),
                       ("requests_waiting", "requests waiting for a connection")):
        Gauge(f"leasehold_db_pool_{stat.removeprefix('pool_')}", f"Database pool: {what}",
              registry=metrics.registry).set_function(_pool_stat(pool, stat))
    if hints is not None:
        hints.start()
    try:
        async with db.connection() as conn:
            for warning in await privilege_warnings(conn):
                log.warning("%s; run the Gateway as a login role made by `leasehold db create-app-role`",
                            warning, extra={"database_role": "privileged"})
    except Exception:  # the database may not be up yet; the Gateway still starts
        log.exception("could not check the database role's privileges")
    bootstrap_key = settings.bootstrap_key()
    if bootstrap_key:
        try:
            if not await services.registry.store_bootstrap_key(bootstrap_key):
                log.error("the bootstrap administrator key was revoked before and stays revoked; start with a new key")
        except Exception:  # the database may not be up yet; the Gateway still starts
            log.exception("could not store the bootstrap administrator key")
    # Before it serves: the tasks stored before the input limits that break them (migration 0022
    # listed them) end on the record, so no acquire leases one whose answer cannot be encoded.
    ended = await services.lifecycle.end_undeliverable()
    if ended:
        log.warning("cancelled %d tasks stored before the input limits (undeliverable)", len(ended),
                    extra={"task_ids": [str(t) for t in ended[:20]]})
    loops = [
        asyncio.create_task(sweeper.run(services.lifecycle, settings.sweep_interval_seconds,
                                        lambda changed: _swept(metrics, changed)),
                            name="leasehold-sweeper"),
        asyncio.create_task(sampler.run(db, metrics, settings.metrics_sample_seconds), name="leasehold-sampler"),
        asyncio.create_task(presence.run(db, app[PRESENCE], settings.presence_publish_seconds,
                                         on_publish=metrics.presence_published,
                                         on_pass=lambda: metrics.passed("presence")), name="leasehold-presence"),
        asyncio.create_task(run_sweep(notifier.room, db, settings.wake_sweep_seconds, services.lifecycle.clock),
                            name="leasehold-wake-sweep"),
        asyncio.create_task(bulk.run(services.bulk, settings.bulk_interval_seconds, settings.bulk_batch,
                                     hold=settings.bulk_hold_seconds, on_pass=lambda _: metrics.passed("bulk")),
                            name="leasehold-bulk"),
    ]
    sender = webhooks.Sender(
        services.webhooks, webhooks.session(), timeout=settings.webhook_timeout_seconds,
        max_attempts=settings.webhook_max_attempts,
        backoff=RetryPolicy(base_seconds=settings.webhook_backoff_base_seconds,
                            cap_seconds=settings.webhook_backoff_cap_seconds),
        on_send=lambda outcome: metrics.webhook_sends.labels(outcome).inc())
    loops.append(asyncio.create_task(
        webhooks.run(sender, settings.webhook_interval_seconds, idle=timedelta(seconds=settings.worker_idle_seconds),
                     gone_every=settings.presence_publish_seconds, on_pass=lambda _: metrics.passed("webhooks")),
        name="leasehold-webhooks"))
    sealer = app.get(SEALER)
    if sealer is not None:
        loops.append(asyncio.create_task(checkpointer.run(db, settings.seal_interval_seconds, sealer,
                                                          on_pass=metrics.sealed),
                                         name="leasehold-seals"))
    elif settings.checkpoint_interval_seconds > 0:
        loops.append(asyncio.create_task(checkpointer.run(db, settings.checkpoint_interval_seconds,
                                                          on_pass=lambda _: metrics.passed("checkpoints")),
                                         name="leasehold-checkpoints"))
    if settings.partition_interval_seconds > 0:
        loops.append(asyncio.create_task(partitioner.run(db, settings.partition_interval_seconds,
                                                         span=settings.partition_span, ahead=settings.partition_ahead,
                                                         on_pass=lambda _: metrics.passed("partitions")),
                                         name="leasehold-partitions"))
    if settings.schedule_interval_seconds > 0:
        loops.append(asyncio.create_task(scheduler.run(services.schedules, settings.schedule_interval_seconds,
                                                       on_pass=lambda _: metrics.passed("scheduler")),
                                         name="leasehold-scheduler"))
    for task in loops:  # a loop that never passes shows as passed at 0 (1970), not as no series at all
        metrics.loop_passes.labels(task.get_name().removeprefix("leasehold-"))
    checks = Gauge("leasehold_health_degraded", "1 while this process's health check finds that dependency slow "
                   "or down, by check: database, listen, redis, digest_sink, partitions (see GET /v1/health)",
                   ["check"], registry=metrics.registry)
    for name in health.CHECKS:
        checks.labels(name).set_function(_degraded(app, name))
    try:
        yield
    finally:
        for task in loops:
            task.cancel()
        # Bounded: a loop that does not stop must not keep the process from exiting.
        _, stuck = await asyncio.wait(loops, timeout=LOOP_STOP_SECONDS)
        if stuck:
            log.warning("background loops did not stop in time", extra={"loops": [t.get_name() for t in stuck]})
        await sender.session.close()
        # What this process saw since its last publish goes out before the pool closes: a stop
        # loses no presence (a crash loses at most one interval). Bounded: with the database
        # away, stopping does not wait for it.
        try:
            await asyncio.wait_for(presence.publish(db, app[PRESENCE], on_publish=metrics.presence_published),
                                   PRESENCE_STOP_SECONDS)
        except Exception:
            log.warning("could not publish worker presence on the way out", exc_info=True)
        if hints is not None:
            await hints.stop()
        await notifier.stop()
        if read_pool is not None:
            await read_pool.close()
        await pool.close()


def _degraded(app: web.Application, check: str) -> Callable[[], float]:
    return lambda: 1.0 if health.assess(app)[check].degraded else 0.0


def _swept(metrics: Metrics, changed: int) -> None:
    metrics.swept.inc(changed)
    metrics.passed("sweeper")


def _pool_stat(pool: AsyncConnectionPool, name: str) -> Callable[[], float]:
    return lambda: float(pool.get_stats().get(name, 0))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("leasehold")
    except PackageNotFoundError:
        return "unknown"


def create_app(settings: GatewaySettings) -> web.Application:
    """The Gateway as an aiohttp application (serve it with :mod:`gateway.serve`)."""
    app = web.Application(middlewares=[request_log_middleware, error_middleware, listener_middleware],
                          client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app[METRICS] = Metrics(version=_version(), schema_revision=expected_revision())
    app[OBSERVE_REQUEST] = app[METRICS].observe_request
    app[BUCKETS] = TokenBuckets(settings.rate_limit_per_second, settings.rate_limit_burst)
    app[CERTIFICATES] = KnownCertificates()
    app[AUTH_FAILURES] = FailureBudgets(settings.auth_failures_per_minute / 60, settings.auth_failure_burst)
    app[PRESENCE] = Presence()
    if settings.seal_key_file is not None and settings.digest_dir is not None:
        # Loaded before serving: a missing or wrong key stops the start, not the first seal.
        app[SEALER] = Sealer(load_private_key(settings.seal_key_file), open_sink(settings.digest_dir))
    routes: list[Route] = [*service_api.routes, *worker_api.routes, *operator_api.routes]
    app[ROUTES] = routes
    served: dict[int, tuple[str, ...]] = {}
    # The console's pages are served like the API's routes but are not part of its document.
    for route in [*routes, *console_routes]:
        served[id(app.router.add_route(route.method, route.path, route.handler))] = listeners_of(route)
    app[ROUTE_LISTENERS] = served
    app.cleanup_ctx.append(_resources)
    app.on_shutdown.append(_answer_long_polls)
    return app


async def _answer_long_polls(app: web.Application) -> None:
    """Stopping: every waiting acquire long-poll answers 204 now, rather than at its deadline."""
    notifier = app.get(NOTIFIER)
    if notifier is not None:
        notifier.close()
