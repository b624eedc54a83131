"""Named SQL statements, one ``.sql`` file per table, loaded once.

Each file holds blocks introduced by ``-- name: some_name``; the block runs to the next
``-- name:``. Access them as ``QUERIES["some_name"]``. Statements take psycopg named
parameters (``%(name)s``); ``%(now)s`` is the injectable clock: ``coalesce(%(now)s, now())``
in SQL means "the test's clock if it set one, else the database's".
"""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def _load() -> dict[str, str]:
    queries: dict[str, str] = {}
    for entry in sorted(resources.files(__package__).iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text()
        parts = _NAME.split(text)
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise RuntimeError(f"duplicate query name {name} in {entry.name}")
            queries[name] = body.strip().rstrip(";")
    return queries


QUERIES: dict[str, str] = _load()
