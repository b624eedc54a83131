"""The Gateway's logs: one JSON object per line on stderr, with the worker agent's formatter
(:class:`leasehold.protocol.logs.JsonFormatter`: UTC timestamps with milliseconds, pid, the request id and
operator key id of the request being handled, secrets redacted). Never log bodies: they carry
tokens."""

from __future__ import annotations

import logging
import sys

from leasehold.protocol.logs import JsonFormatter

__all__ = ["JsonFormatter", "configure_logging"]


def configure_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Alembic's plugin set-up chatter (the schema check reads its script directory) stays out.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))
