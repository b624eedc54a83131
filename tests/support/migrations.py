"""A migration revision's module, for tests that run part of its SQL (e.g. a data migration's
query on rows they wrote past today's rules)."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from leasehold.migrations.runner import MIGRATIONS_DIR


def revision_module(filename: str) -> ModuleType:
    """``migrations/versions/<filename>`` loaded as a module (alembic loads it by path too)."""
    spec = importlib.util.spec_from_file_location(f"revision_{filename.removesuffix('.py')}",
                                                  MIGRATIONS_DIR / "versions" / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
