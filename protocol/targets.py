"""Resolving the names of a scope's targets, for the target policy (:mod:`domain.targets`).

The agent checks a task's targets after resolving their names and before its plugin runs
(:meth:`leasehold.worker.runner.TaskRunner._run`); the Gateway does the same when a scan, schedule or task
is created. A name that does not resolve (in time) is judged by its name alone.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping
from typing import Any

from leasehold.domain.targets import TargetRefused, check_scope, names_of, policy_from_json

#: How long one name may take to resolve.
RESOLVE_TIMEOUT_SECONDS = 2.0
#: How many names are resolved at once.
CONCURRENT_LOOKUPS = 16


async def resolve_names(scope: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """Every address each target name of ``scope`` resolves to (no entry: it did not resolve)."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(CONCURRENT_LOOKUPS)

    async def lookup(name: str) -> list[str]:
        async with gate:
            try:
                infos = await asyncio.wait_for(loop.getaddrinfo(name, None, type=socket.SOCK_STREAM),
                                               RESOLVE_TIMEOUT_SECONDS)
            except (OSError, UnicodeError, TimeoutError):
                return []
        return list(dict.fromkeys(str(info[4][0]) for info in infos))

    names = names_of(scope)
    found = await asyncio.gather(*(lookup(name) for name in names))
    return {name: addresses for name, addresses in zip(names, found, strict=True) if addresses}


async def refused_target(scope: Mapping[str, Any] | None, policy: Mapping[str, Any] | None) -> TargetRefused | None:
    """Why the target policy refuses ``scope`` (its names resolved now), or None."""
    try:
        check_scope(policy_from_json(policy), scope, await resolve_names(scope))
    except TargetRefused as refused:
        return refused
    return None
