"""Logs on stderr: human-readable lines, or one JSON object per line — the worker's
``--log-format json`` and the Gateway's only format, with this one :class:`JsonFormatter`.

A JSON line is ``{"ts", "level", "logger", "msg", "pid", ...}``: ``ts`` in UTC, ISO 8601 with
milliseconds (``2026-05-04T10:11:12.345Z``), then the fields of :data:`LOG_CONTEXT` (the Gateway
puts the request id and the operator key id there while it handles a request), then the
``extra={...}`` fields of the call. Lease tokens and keys are never logged: no request body is
ever logged, lease tokens are ``SecretStr`` objects, and fields named like secrets are redacted
by both formatters anyway.
"""

from __future__ import annotations

import logging
import os
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

__all__ = ["LOG_CONTEXT", "JsonFormatter", "TextFormatter", "configure_logging", "extra_fields", "utc_timestamp"]

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}
_SECRET_KEYS = frozenset({"lease_token", "token", "authorization", "password", "key_password", "api_key"})
#: Fields every log line of the current task carries (the Gateway: request id, operator key id).
LOG_CONTEXT: ContextVar[dict[str, Any] | None] = ContextVar("leasehold_log_context", default=None)
REDACTED = "[redacted]"


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra={...}`` fields of a record, secrets redacted."""
    return {key: REDACTED if key.lower() in _SECRET_KEYS else value
            for key, value in record.__dict__.items()
            if key not in _STANDARD and not key.startswith("_")}


def utc_timestamp(created: float) -> str:
    """``2026-05-04T10:11:12.345Z``: UTC, ISO 8601, milliseconds."""
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", "pid", ...context, ...extra}`` per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {"ts": utc_timestamp(record.created), "level": record.levelname,
                                 "logger": record.name, "msg": record.getMessage(), "pid": record.process or os.getpid(),
                                 **(LOG_CONTEXT.get() or {}), **extra_fields(record)}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    """``HH:MM:SS LEVEL message key=value …`` (``with_time=False``: for rich, which shows it)."""

    def __init__(self, *, with_time: bool = True) -> None:
        super().__init__()
        self.with_time = with_time

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{key}={_text(value)}" for key, value in extra_fields(record).items())
        head = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} " if self.with_time else ""
        line = f"{head}{record.getMessage()}" + (f"  {fields}" if fields else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text(value: object) -> str:
    text = str(value)
    return repr(text) if (" " in text or not text) else text


def configure_logging(log_format: str = "text", level: str = "INFO", *, stream: TextIO | None = None,
                      rich_console: Any = None) -> None:
    """Send every ``leasehold`` log to stderr in ``log_format``; with ``rich_console`` (text on a
    terminal) through rich, so log lines scroll above the live status table."""
    handler: logging.Handler
    if log_format == "json":
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(JsonFormatter())
    elif rich_console is not None:
        from rich.logging import RichHandler  # deferred: rich only for a text log on a terminal

        handler = RichHandler(console=rich_console, show_path=False, markup=False, rich_tracebacks=False,
                              log_time_format="%H:%M:%S")
        handler.setFormatter(TextFormatter(with_time=False))
    else:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Third-party chatter stays out unless asked for.
    for noisy in ("asyncio", "aiohttp"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
