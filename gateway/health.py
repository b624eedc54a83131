"""Which dependency of a Gateway process is slow or down, said by ``/readyz`` (names only) and
``GET /v1/health`` (the detail), and exported as ``leasehold_health_degraded{check}``.

Everything here reads what the process already knows (its LISTEN connection, Redis, the seal
loop, the sampled database gauges): a probe costs no query beyond ``/readyz``'s own.
A degraded Gateway still serves (``/readyz`` answers 200): each check says what suffers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiohttp import web

from leasehold.gateway.keys import HINTS, METRICS, NOTIFIER, SEALER, SETTINGS

#: A round trip to the database slower than this (seconds) is degraded.
SLOW_DATABASE_SECONDS = 0.5
#: Event log partitions reaching less than this past now (seconds) are degraded: new events
#: will soon land in the default partition, which retention cannot drop.
PARTITIONS_AHEAD_SECONDS = 7 * 86400
#: A seal older than this many seal intervals (and at least a minute) is degraded.
SEAL_INTERVALS = 10
SEAL_MIN_SECONDS = 60.0
#: The checks, in the order they are reported.
CHECKS = ("database", "listen", "redis", "digest_sink", "partitions")


@dataclass(frozen=True, slots=True)
class Check:
    state: str  # "ok", "degraded" or "off" (not configured)
    detail: str
    #: the measurement the state was judged on (seconds), when there is one
    seconds: float | None = None

    @property
    def degraded(self) -> bool:
        return self.state == "degraded"


def assess(app: web.Application, *, database_latency: float | None = None) -> dict[str, Check]:
    """Every check of this process; ``database_latency`` (a round trip just measured) takes the
    place of the sampled one."""
    now = time.time()
    return {"database": _database(app, database_latency), "listen": _listen(app), "redis": _redis(app),
            "digest_sink": _digest_sink(app, now), "partitions": _partitions(app)}


def degraded(checks: dict[str, Check]) -> list[str]:
    return [name for name, check in checks.items() if check.degraded]


def _database(app: web.Application, measured: float | None) -> Check:
    metrics = app[METRICS]
    if measured is None:
        if metrics.sampled_at is None:
            return Check("ok", "not sampled yet")
        measured = metrics.database_latency_seconds
    if measured > SLOW_DATABASE_SECONDS:
        return Check("degraded", f"a round trip took {measured:.3f} s (slow above {SLOW_DATABASE_SECONDS} s)",
                     measured)
    return Check("ok", f"a round trip took {measured:.3f} s", measured)


def _listen(app: web.Application) -> Check:
    if not app[SETTINGS].listen:
        return Check("off", "the notification listener is turned off (listen = false): long-polls wake by polling")
    if app[NOTIFIER].connected.is_set():
        return Check("ok", "the LISTEN connection is up")
    return Check("degraded", "the LISTEN connection is down: long-polls wake only by the fallback sweep")


def _redis(app: web.Application) -> Check:
    hints = app.get(HINTS)
    if hints is None:
        return Check("off", "no redis_url")
    if hints.connected:
        return Check("ok", "publishing and subscribed")
    return Check("degraded", "Redis is unavailable: replicas wake each other only through the database")


def _digest_sink(app: web.Application, now: float) -> Check:
    if app.get(SEALER) is None:
        return Check("off", "sealing is not configured")
    metrics = app[METRICS]
    limit = max(SEAL_MIN_SECONDS, SEAL_INTERVALS * app[SETTINGS].seal_interval_seconds)
    last = metrics.last_seal_at
    if last <= 0:
        waited = now - metrics.started
        if waited <= limit:
            return Check("ok", "no seal yet since the start", waited)
        return Check("degraded", f"no seal published in the {waited:.0f} s since the start", waited)
    age = now - last
    if age > limit:
        return Check("degraded", f"the newest seal is {age:.0f} s old (stale above {limit:.0f} s)", age)
    return Check("ok", f"the newest seal is {age:.0f} s old", age)


def _partitions(app: web.Application) -> Check:
    metrics = app[METRICS]
    if metrics.sampled_at is None:
        return Check("ok", "not sampled yet")
    ahead = metrics.partitions_ahead_seconds
    if ahead < PARTITIONS_AHEAD_SECONDS:
        return Check("degraded", f"the event log's partitions reach only {ahead / 86400:.1f} days ahead "
                                 f"(degraded below {PARTITIONS_AHEAD_SECONDS // 86400})", ahead)
    return Check("ok", f"the event log's partitions reach {ahead / 86400:.1f} days ahead", ahead)
