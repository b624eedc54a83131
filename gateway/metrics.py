"""Prometheus metrics of one Gateway process (``/metrics`` on the operator port).

Request latency (``leasehold_http_request_duration_seconds``) leaves out the acquire long-polls,
whose duration is mostly waiting: those are ``leasehold_acquire_duration_seconds``. The gauges
that need the database (queue depth, oldest pending age, live leases) are sampled by
:mod:`gateway.background.sampler`, never on a request's path.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from leasehold.domain.events import TaskLeased

#: Set by the ``--processes`` supervisor for its children: counters and histograms then live in
#: files there, summed over every process (alive or dead) by whichever process answers.
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Families that name organisations (only for an administrator key).
ORGANIZATION_PREFIX = "leasehold_organization_"
#: The gauges kept in files with ``--processes`` (sampled from the database, or constant); every
#: other gauge describes the answering process itself and comes from its memory.
SHARED_GAUGES = frozenset({"leasehold_live_leases", "leasehold_queue_depth", "leasehold_oldest_pending_age_seconds",
                           "leasehold_build_info", "leasehold_organization_queue_depth",
                           "leasehold_organization_oldest_pending_age_seconds"})

#: The unfinished task states the queue gauges report.
QUEUE_STATES = ("pending", "leased", "running", "retry_wait", "cancelling")
#: The acquire route: long-polls, measured apart from the other requests.
ACQUIRE_ROUTE = "/v1/tasks/acquire"


class Metrics:
    def __init__(self, *, version: str = "unknown", schema_revision: str | None = None) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("leasehold_http_requests_total", "HTTP requests", ["method", "route", "status"],
                                registry=self.registry)
        self.latency = Histogram("leasehold_http_request_duration_seconds",
                                 "HTTP request latency (acquire long-polls excluded)", ["route"],
                                 registry=self.registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.acquire = Histogram("leasehold_acquire_duration_seconds",
                                 "Acquire requests, long-poll wait included, by outcome (leased, empty, refused)",
                                 ["outcome"], registry=self.registry,
                                 buckets=(0.005, 0.025, 0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60))
        self.transitions = Counter("leasehold_lifecycle_transitions_total", "Events appended, by type",
                                   ["event"], registry=self.registry)
        self.lease_expiries = Counter("leasehold_lease_expiries_total",
                                      "Leases that expired (the worker stopped renewing)", registry=self.registry)
        self.rejections = Counter("leasehold_rejections_total",
                                  "Requests refused with a 4xx problem, by its code (stale lease, conflict, "
                                  "validation, forbidden, rate limited…)", ["reason"], registry=self.registry)
        self.live_leases = Gauge("leasehold_live_leases", "Attempts holding a live lease (sampled)",
                                 registry=self.registry, multiprocess_mode="mostrecent")
        self.queue_state = Gauge("leasehold_queue_depth", "Unfinished tasks by state (sampled)", ["state"],
                                 registry=self.registry, multiprocess_mode="mostrecent")
        self.oldest_pending_all = Gauge("leasehold_oldest_pending_age_seconds",
                                        "Age of the oldest pending task (sampled)", registry=self.registry,
                                        multiprocess_mode="mostrecent")
        #: Series that name organisations: served only to an administrator key (see :meth:`render`).
        self.by_organization = CollectorRegistry()
        self.queue_depth = Gauge("leasehold_organization_queue_depth",
                                 "Unfinished tasks by organisation and state (sampled)", ["organization", "state"],
                                 registry=self.by_organization, multiprocess_mode="mostrecent")
        self.oldest_pending = Gauge("leasehold_organization_oldest_pending_age_seconds",
                                    "Age of the oldest pending task, by organisation (sampled)", ["organization"],
                                    registry=self.by_organization, multiprocess_mode="mostrecent")
        self._queue_series: set[tuple[str, str]] = set()
        self._oldest_series: set[str] = set()
        self.organization_leases = Counter(
            "leasehold_organization_leases_total", "Leases granted, by organisation", ["organization"],
            registry=self.by_organization)
        self.organization_wait = Histogram(
            "leasehold_organization_wait_seconds",
            "How long leased tasks waited between becoming available and being leased, by organisation",
            ["organization"], registry=self.by_organization,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400))
        self.cancel_legs = Histogram(
            "leasehold_cancellation_leg_seconds",
            "Cancellation latency by leg: request_to_delivery (cancel requested -> first handed to the "
            "worker) and delivery_to_ack (handed -> the worker acknowledged), by delivery channel",
            ["leg", "channel"], registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
        self.auth_failures = Counter(
            "leasehold_auth_failures_total",
            "Failed operator authentications (unknown, revoked or expired API key), by door (api, console)",
            ["door"], registry=self.registry)
        self.auth_throttled = Counter(
            "leasehold_auth_throttled_total",
            "Operator authentications refused (429) because the failure budget of the source address or of "
            "the key prefix was spent, by door and budget (source, prefix)", ["door", "budget"],
            registry=self.registry)
        self.admission_refused = Counter(
            "leasehold_admission_refused_total",
            "Creations refused because the organisation was at its admission cap of queued work, by kind "
            "(task, scan: a scan of the API, a profile run or a schedule's due slot)", ["kind"],
            registry=self.registry)
        for kind in ("task", "scan"):
            self.admission_refused.labels(kind)
        self.swept = Counter("leasehold_sweeper_changes_total", "Tasks changed by the lease sweeper",
                             registry=self.registry)
        # Per process (each runs its own loops): a loop that stops passing shows as a timestamp
        # that stops moving, whatever the reason (stuck, crashing on every pass, never started).
        self.loop_passes = Gauge("leasehold_background_last_pass_timestamp_seconds",
                                 "When each background loop of this process last finished a pass (Unix time), "
                                 "by loop: sweeper, sampler, presence, seals, checkpoints, partitions, scheduler",
                                 ["loop"], registry=self.registry)
        #: Read by :mod:`gateway.health`: when the database gauges were last sampled (``None``:
        #: not yet), their values, and the time of the newest seal seen (0: none yet).
        self.sampled_at: float | None = None
        self.database_latency_seconds = 0.0
        self.partitions_ahead_seconds = 0.0
        self.last_seal_at = 0.0
        self.started = time.time()
        self.database_latency = Gauge("leasehold_database_latency_seconds",
                                      "Round trip of a trivial query to the database, as last sampled",
                                      registry=self.registry)
        self.partitions_reach = Gauge("leasehold_event_partitions_ahead_seconds",
                                      "How far past now the event log's time partitions reach, as last sampled "
                                      "(negative: events already land in the default partition)",
                                      registry=self.registry)
        self.last_seal = Gauge("leasehold_last_seal_timestamp_seconds",
                               "When the newest record in the digest sink was sealed (Unix time), as this "
                               "process's seal loop last saw it; 0 until it has seen one", registry=self.registry)
        self.presence_publishes = Counter(
            "leasehold_presence_publishes_total",
            "Worker presence publishes: one statement each, for every worker seen since the last one",
            registry=self.registry)
        self.webhook_sends = Counter(
            "leasehold_webhook_sends_total",
            "Webhook deliveries sent by this process, by outcome: delivered (a 2xx answer), retry (failed, due "
            "again after its backoff), dead (failed with its attempts spent: a dead letter)",
            ["outcome"], registry=self.registry)
        for outcome in ("delivered", "retry", "dead"):
            self.webhook_sends.labels(outcome)
        self.presence_workers = Counter(
            "leasehold_presence_workers_published_total",
            "Workers whose last poll, renew or write went out in a presence publish", registry=self.registry)
        Gauge("leasehold_build_info", "The running Gateway: version, schema revision it needs, Python",
              ["version", "schema_revision", "python"], registry=self.registry, multiprocess_mode="max").labels(
            version, schema_revision or "none", platform.python_version()).set(1)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        if route == ACQUIRE_ROUTE:
            outcome = "leased" if status == 200 else "empty" if status == 204 else "refused"
            self.acquire.labels(outcome).observe(seconds)
        else:
            self.latency.labels(route).observe(seconds)

    def sampled(self, *, database_latency: float, partitions_ahead: float) -> None:
        self.database_latency_seconds, self.partitions_ahead_seconds = database_latency, partitions_ahead
        self.database_latency.set(database_latency)
        self.partitions_reach.set(partitions_ahead)
        self.sampled_at = time.time()

    def sealed(self, at: float) -> None:
        """The seal loop passed; the newest seal in the sink was made at ``at`` (Unix time)."""
        self.last_seal_at = at
        self.last_seal.set(at)
        self.passed("seals")

    def passed(self, loop: str) -> None:
        """A pass of background loop ``loop`` finished (see ``leasehold_background_last_pass_timestamp_seconds``)."""
        self.loop_passes.labels(loop).set_to_current_time()

    def rejected(self, reason: str) -> None:
        self.rejections.labels(reason).inc()

    def refused_admission(self, kind: str) -> None:
        self.admission_refused.labels(kind).inc()

    def presence_published(self, workers: int) -> None:
        self.presence_publishes.inc()
        self.presence_workers.inc(workers)

    def count_events(self, events: Sequence[object]) -> None:
        for event in events:
            name = type(event).__name__
            self.transitions.labels(name).inc()
            if name == "LeaseExpired":
                self.lease_expiries.inc()
            if isinstance(event, TaskLeased) and event.fair_share is not None:
                share = event.fair_share  # served and waiting time of the lease's organisation
                organization = str(share.organization_id)
                self.organization_leases.labels(organization).inc()
                self.organization_wait.labels(organization).observe(share.waited_seconds)

    def observe_cancel(self, leg: str, channel: str, seconds: float) -> None:
        self.cancel_legs.labels(leg, channel).observe(max(0.0, seconds))

    def set_queue(self, rows: Sequence[Sequence[object]]) -> None:
        """Replace the queue gauges with one sample: ``(organisation, state, tasks, oldest pending s)``."""
        # Series of the last sample that this one lacks drop to 0 (clearing labels does not work
        # with --processes, where the values live in files).
        for series in self._queue_series:
            self.queue_depth.labels(*series).set(0)
        for previous in self._oldest_series:
            self.oldest_pending.labels(previous).set(0)
        self._queue_series = {(str(o), str(state)) for o, state, _, _ in rows}
        self._oldest_series = {str(o) for o, _, _, oldest in rows if oldest is not None}
        by_state: dict[str, float] = dict.fromkeys(QUEUE_STATES, 0.0)
        oldest_of_all = 0.0
        for organization, state, tasks, oldest in rows:
            self.queue_depth.labels(str(organization), str(state)).set(float(tasks))  # type: ignore[arg-type]
            by_state[str(state)] = by_state.get(str(state), 0.0) + float(tasks)  # type: ignore[arg-type]
            if oldest is not None:
                self.oldest_pending.labels(str(organization)).set(float(oldest))  # type: ignore[arg-type]
                oldest_of_all = max(oldest_of_all, float(oldest))  # type: ignore[arg-type]
        for state, tasks in by_state.items():
            self.queue_state.labels(state).set(tasks)
        self.oldest_pending_all.set(oldest_of_all)

    def render(self, *, by_organization: bool = False) -> bytes:
        """The metrics; ``by_organization`` (an administrator asks) adds the per-organisation series,
        which name organisations and so are not for everyone who can reach the port."""
        directory = os.environ.get(MULTIPROCESS_ENV)
        if directory:
            return generate_latest(_Aggregated(directory, self.registry, by_organization=by_organization))
        text = generate_latest(self.registry)
        return text + generate_latest(self.by_organization) if by_organization else text


class _Aggregated(Collector):
    """With ``--processes``: the families kept in files, summed (counters, histograms) or most
    recent (sampled gauges) over every process; then the gauges of this process's own state
    (LISTEN connection, waiting long-polls, pool) that only it can know."""

    def __init__(self, directory: str, local: CollectorRegistry, *, by_organization: bool) -> None:
        self.directory, self.local, self.by_organization = directory, local, by_organization

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.multiprocess import MultiProcessCollector

        for family in MultiProcessCollector(None, path=self.directory).collect():
            if family.name.startswith(ORGANIZATION_PREFIX) and not self.by_organization:
                continue
            if family.type == "gauge" and family.name not in SHARED_GAUGES:
                continue  # a per-process gauge: this process's own value follows
            yield family
        for family in self.local.collect():
            if family.type == "gauge" and family.name not in SHARED_GAUGES:
                yield family
