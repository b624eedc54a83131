"""Retry backoff: bounded exponential with jitter.

Pure: the caller passes the jitter draw (a float in [0, 1)), so a decision can be replayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``base * 2**(attempt-1)`` capped at ``cap``, then scaled into ``[1-jitter, 1]`` of itself."""

    base_seconds: float = 2.0
    cap_seconds: float = 300.0
    jitter: float = 0.5

    def delay(self, attempt_number: int, draw: float) -> timedelta:
        """Backoff before the attempt after ``attempt_number`` (1-based); ``draw`` in [0, 1)."""
        if attempt_number < 1:
            raise ValueError("attempt_number starts at 1")
        if not 0.0 <= draw < 1.0:
            raise ValueError("draw must be in [0, 1)")
        exponential = min(self.cap_seconds, self.base_seconds * 2 ** min(attempt_number - 1, 30))
        scaled = exponential * (1.0 - self.jitter * draw)
        return timedelta(seconds=scaled)


DEFAULT_RETRY_POLICY = RetryPolicy()
