"""Prometheus metrics of one Gateway process (``/metrics``)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from domain.events import TaskLeased


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("leasehold_http_requests_total", "HTTP requests", ["method", "route", "status"],
                                registry=self.registry)
        self.latency = Histogram("leasehold_http_request_duration_seconds", "HTTP request latency",
                                 ["route"], registry=self.registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.transitions = Counter("leasehold_lifecycle_transitions_total", "Events appended, by type",
                                   ["event"], registry=self.registry)
        self.live_leases = Gauge("leasehold_live_leases", "Attempts holding a live lease (sampled)",
                                 registry=self.registry)
        self.organization_leases = Counter(
            "leasehold_organization_leases_total", "Leases granted, by organisation", ["organization"],
            registry=self.registry)
        self.organization_wait = Histogram(
            "leasehold_organization_wait_seconds",
            "How long leased tasks waited between becoming available and being leased, by organisation",
            ["organization"], registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400))
        self.swept = Counter("leasehold_sweeper_changes_total", "Tasks changed by the lease sweeper",
                             registry=self.registry)
        self.cancel_legs = Histogram(
            "leasehold_cancellation_leg_seconds",
            "Cancellation latency by leg: request_to_delivery (cancel requested -> first handed to the "
            "worker) and delivery_to_ack (handed -> the worker acknowledged), by delivery channel",
            ["leg", "channel"], registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def count_events(self, events: Sequence[object]) -> None:
        for event in events:
            self.transitions.labels(type(event).__name__).inc()
            if isinstance(event, TaskLeased) and event.fair_share is not None:
                share = event.fair_share  # served and waiting time of the lease's organisation
                organization = str(share.organization_id)
                self.organization_leases.labels(organization).inc()
                self.organization_wait.labels(organization).observe(share.waited_seconds)

    def observe_cancel(self, leg: str, channel: str, seconds: float) -> None:
        self.cancel_legs.labels(leg, channel).observe(max(0.0, seconds))

    def render(self) -> bytes:
        return generate_latest(self.registry)
