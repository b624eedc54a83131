"""Fixtures for the worker agent tests: a real Gateway per test whose retry backoff is short, and
a directory for test plugins (:mod:`support.agent_fixtures`). Helpers are in :mod:`support.agent`."""

from support.agent_fixtures import gateway, plugins_dir

__all__ = ["gateway", "plugins_dir"]
