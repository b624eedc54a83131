"""The service layer: one transaction per command, usable without HTTP.

Every command follows the same steps: lock the rows it touches, decide with pure domain code,
append the events (with their hash chain) and apply their projections, commit. Errors are
:mod:`domain.errors`; psycopg errors are translated in :mod:`persistence.transaction`.
"""

from gateway.commands.lifecycle import Acquired, BatchAck, Lifecycle, Renewed
from gateway.commands.registry import Registry

__all__ = ["Acquired", "BatchAck", "Lifecycle", "Registry", "Renewed"]
