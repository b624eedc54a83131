"""Audit tools over the event log: timelines, rebuilds into a shadow schema, verification of the
projections and of the hash chains, checkpoints, as-of views and offline audit bundles.

Every read that must be consistent runs in one ``REPEATABLE READ, READ ONLY`` snapshot
(:func:`persistence.snapshot.snapshot`), so the tools are safe to run while the Gateway writes.
The command line lives in :mod:`cli.replay` (``leasehold replay …``); the Gateway calls
:func:`write_checkpoint` periodically.
"""

from leasehold.persistence.checkpoints import Checkpoint, write_checkpoint

__all__ = ["Checkpoint", "write_checkpoint"]
