"""Task lifecycle commands: create, acquire, worker writes, cancel, and the sweeper's steps.

Each public method is one transaction (see :mod:`persistence.transaction`):

1. lock the task row (``FOR UPDATE``; ``SKIP LOCKED`` when choosing work),
2. decide with :func:`domain.task.decide`,
3. append the events and apply their projections (:meth:`Transaction.append`),
4. when the task reached a terminal state, lock its scan and settle the scan's status
   (:func:`gateway.commands.scans.settle_scan`),
5. commit.

A worker write refused by fencing is still committed, as a ``WriteRejected`` event, and the
matching error is raised after the commit.

The commands are grouped by who issues them, one module each (:mod:`.acquisition`, :mod:`.writes`,
:mod:`.commands`, :mod:`.sweeps`, :mod:`.revocation`, :mod:`.undeliverable`), over :mod:`.base`,
the state and the tail they share; :class:`Lifecycle` is all of them."""

from __future__ import annotations

from leasehold.gateway.commands.lifecycle.acquisition import Acquisition
from leasehold.gateway.commands.lifecycle.base import (
    MAX_RECORDED_REJECTIONS,
    NO_TASK_TYPES,
    TERMINAL,
    UNDELIVERABLE,
    Acquired,
    BatchReceipt,
    CancelLegObserver,
    Poll,
    Renewed,
    ResultBatch,
    TaskSpec,
    WriteMaker,
    attempts_ended,
    cancel_legs,
    hash_token,
    no_such_attempt,
    refuse_after_revocation,
    release_attempts,
)
from leasehold.gateway.commands.lifecycle.commands import TaskCommands
from leasehold.gateway.commands.lifecycle.revocation import Revocation
from leasehold.gateway.commands.lifecycle.sweeps import Sweeps
from leasehold.gateway.commands.lifecycle.undeliverable import Undeliverable
from leasehold.gateway.commands.lifecycle.writes import WorkerWrites
from leasehold.protocol.wire import MAX_MULTI_REQUEST_ID, MAX_TASKS_PER_ACQUIRE


class Lifecycle(Acquisition, WorkerWrites, TaskCommands, Sweeps, Revocation, Undeliverable):
    """Commands on worker tasks. ``clock`` and ``rng`` are injectable for tests."""


__all__ = [
    'Acquired',
    'BatchReceipt',
    'CancelLegObserver',
    'Lifecycle',
    'MAX_MULTI_REQUEST_ID',
    'MAX_RECORDED_REJECTIONS',
    'MAX_TASKS_PER_ACQUIRE',
    'NO_TASK_TYPES',
    'Poll',
    'Renewed',
    'ResultBatch',
    'TERMINAL',
    'TaskSpec',
    'UNDELIVERABLE',
    'WriteMaker',
    'attempts_ended',
    'cancel_legs',
    'hash_token',
    'no_such_attempt',
    'refuse_after_revocation',
    'release_attempts',
]
