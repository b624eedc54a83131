"""The operator console: server-rendered HTML pages on the operator port under ``/console``.

Sign-in exchanges an operator API key for a session (:mod:`gateway.console.sessions`); the pages
(:mod:`gateway.console.pages`, :mod:`~gateway.console.workers`, :mod:`~gateway.console.audit`,
all routed by :mod:`gateway.console.site`) read through the same functions as the operator API,
so a key sees in the console exactly what it sees in the API, and every action (cancel, retry,
disable, enable, revoke, unassign) runs the same command and records the same events.
"""
