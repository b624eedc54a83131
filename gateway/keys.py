"""The typed slots of the aiohttp application and of its requests, in one place."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from leasehold.gateway.background.hints import Hints
from leasehold.gateway.background.notify import Notifier
from leasehold.gateway.identity import (
    FailureBudgets,
    KnownCertificates,
    Operator,
    TokenBuckets,
    WorkerIdentity,
)
from leasehold.gateway.metrics import Metrics
from leasehold.gateway.presence import Presence
from leasehold.gateway.services import Services
from leasehold.gateway.settings import GatewaySettings
from leasehold.persistence.seals import Sealer
from leasehold.persistence.transaction import Database

#: Called once per request with (method, route template, status, seconds): metrics hook.
ObserveRequest = Callable[[str, str, int, float], None]

# Per application (one per process).
SETTINGS = web.AppKey("settings", GatewaySettings)
SERVICES = web.AppKey("services", Services)
#: Where the operator reads that tolerate lag go: a replica (``read_database_url``) or the primary.
READ_DATABASE = web.AppKey("read_database", Database)
NOTIFIER = web.AppKey("notifier", Notifier)
HINTS = web.AppKey("hints", Hints)
METRICS = web.AppKey("metrics", Metrics)
OBSERVE_REQUEST: web.AppKey[ObserveRequest] = web.AppKey("observe_request")
ROUTES = web.AppKey("routes", list)
BUCKETS = web.AppKey("rate_buckets", TokenBuckets)
AUTH_FAILURES = web.AppKey("auth_failures", FailureBudgets)
CERTIFICATES = web.AppKey("known_certificates", KnownCertificates)
SEALER = web.AppKey("sealer", Sealer)
#: The workers this process saw, not yet published (gateway.presence).
PRESENCE = web.AppKey("presence", Presence)
#: The connection guards of the listeners (worker, operator), once serving (gateway.serve.start).
GUARDS = web.AppKey("connection_guards", list)
#: Local port -> listener ("worker", "operator", "health"), set when the ports are bound.
LISTENER_PORTS: web.AppKey[dict[int, str]] = web.AppKey("listener_ports")
#: id() of each aiohttp route -> the listeners that serve it.
ROUTE_LISTENERS: web.AppKey[dict[int, tuple[str, ...]]] = web.AppKey("route_listeners")

# Per request.
REQUEST_ID = web.RequestKey("request_id", str)
WORKER_FINGERPRINT = web.RequestKey("worker_fingerprint", str)
WORKER = web.RequestKey("worker", WorkerIdentity)
OPERATOR = web.RequestKey("operator", Operator)
