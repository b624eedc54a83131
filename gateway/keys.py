"""AppKeys: the typed slots of the aiohttp application, in one place."""

from __future__ import annotations

from aiohttp import web
from psycopg_pool import AsyncConnectionPool

from gateway.background.notify import Notifier
from gateway.commands import Lifecycle, Registry
from gateway.settings import GatewaySettings

SETTINGS = web.AppKey("settings", GatewaySettings)
POOL = web.AppKey("pool", AsyncConnectionPool)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
REGISTRY = web.AppKey("registry", Registry)
NOTIFIER = web.AppKey("notifier", Notifier)

# Per-request storage.
REQUEST_ID = web.RequestKey("request_id", str)
WORKER_FINGERPRINT = web.RequestKey("worker_fingerprint", str)
