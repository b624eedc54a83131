"""Worker presence without I/O: the liveness rule at its boundaries, and what a process holds
between two publishes (:mod:`leasehold.gateway.presence`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

from leasehold.gateway.presence import Presence, Seen, latest, liveness
from leasehold.gateway.settings import GatewaySettings

NOW = datetime(2026, 12, 5, 4, 0, tzinfo=UTC)
LIVE, IDLE = timedelta(seconds=60), timedelta(seconds=300)
TICK = timedelta(microseconds=1)


@pytest.mark.parametrize(("age", "expected"), [
    (timedelta(0), "live"),
    (-timedelta(seconds=2), "live"),  # another process's clock, a moment ahead
    (LIVE, "live"),
    (LIVE + TICK, "idle"),
    (IDLE, "idle"),
    (IDLE + TICK, "gone"),
    (timedelta(days=400), "gone"),
])
def test_liveness_at_its_boundaries(age: timedelta, expected: str) -> None:
    assert liveness(NOW - age, NOW, live=LIVE, idle=IDLE) == expected


def test_a_worker_never_seen_is_gone() -> None:
    assert liveness(None, NOW, live=LIVE, idle=IDLE) == "gone"


def test_the_latest_of_poll_renew_and_write_counts() -> None:
    assert latest(None, None, None) is None
    assert latest(NOW - IDLE, None, NOW - TICK) == NOW - TICK


def test_idle_must_outlast_live() -> None:
    with pytest.raises(ValueError, match="worker_idle_seconds"):
        GatewaySettings(worker_live_seconds=100, worker_idle_seconds=50)
    assert GatewaySettings(worker_live_seconds=50, worker_idle_seconds=50).worker_idle_seconds == 50


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


A, B = UUID(int=2), UUID(int=1)


def test_a_publish_takes_the_changed_workers_in_id_order_as_ages_once() -> None:
    clock = FakeClock()
    presence = Presence(clock)
    presence.saw(A, Seen.POLL)
    clock.now += 3
    presence.saw(B, Seen.RENEW)
    presence.saw(A, Seen.POLL)  # polling again changes nothing but the time
    clock.now += 2
    presence.saw(B, Seen.WRITE)
    assert presence.changed == 2
    clock.now += 1
    published = presence.take()
    assert published.worker_ids == [B, A]
    assert published.ages == ([None, 3.0], [3.0, None], [1.0, None])
    assert presence.changed == 0 and len(presence.take()) == 0  # nothing new: nothing to publish

    clock.now += 10
    presence.saw(A, Seen.WRITE)
    again = presence.take()
    assert again.worker_ids == [A] and again.ages == ([13.0], [None], [0.0])  # the poll is kept, older


def test_a_failed_publish_gives_its_workers_back_with_their_times_then() -> None:
    clock = FakeClock()
    presence = Presence(clock)
    presence.saw(A, Seen.POLL)
    failed = presence.take()
    presence.saw(B, Seen.POLL)
    presence.give_back(failed)
    clock.now += 5
    retried = presence.take()
    assert retried.worker_ids == [B, A] and retried.ages[Seen.POLL] == [5.0, 5.0]


def test_a_worker_waiting_in_a_long_poll_is_seen_at_every_publish_until_it_leaves() -> None:
    clock = FakeClock()
    presence = Presence(clock)
    with presence.waiting(A), presence.waiting(A):  # two long-polls of one worker
        clock.now += 40
        assert presence.changed == 1
        assert presence.take().ages == ([0.0], [None], [None])
        clock.now += 40
        assert presence.take().worker_ids == [A]
    assert presence.changed == 0 and len(presence.take()) == 0  # gone from the waiting room
