"""The operator API (bearer API keys): organisations, workers, assignments, tasks."""

from __future__ import annotations

from gateway.http import RouteTable

routes = RouteTable()
