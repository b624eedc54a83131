"""Pause Python's cyclic garbage collector during bulk work.

A rebuild keeps hundreds of thousands of row dictionaries alive while it creates millions of
short-lived events and row changes; every full collection then walks all the live ones, which
measured here more than doubled the fold's CPU time. Nothing a fold creates needs the cycle
collector (reference counting frees it), so collection is paused for the duration and resumed
(not forced) afterwards.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
