"""The one retry policy: bounded attempts, exponential backoff with full jitter.

Only provider failures are retried, and only when repeating the call is safe: the
Space never accepted it (queue full, 429, connection refused — ``before_accept``), or
the caller said the call is idempotent (``safe_to_retry``). A job the Space already
started (a dropped stream, a read timeout, a 5xx mid-job) may have had effects, so it
is not repeated behind the caller's back. Caller errors and policy refusals are never
retried: they would fail the same way.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .._exceptions import PoolError, UpstreamTransportError


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` in all (1 = no retry); delays ``base_s·2^n`` capped, fully jittered."""

    attempts: int = 3
    base_s: float = 0.25
    max_s: float = 5.0

    def should_retry(self, error: PoolError, attempt: int, *, safe_to_retry: bool) -> bool:
        """Whether attempt number ``attempt`` (1-based), which failed with ``error``, may be
        followed by another."""
        if attempt >= self.attempts or not isinstance(error, UpstreamTransportError):
            return False
        return error.before_accept or safe_to_retry

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt`` (full jitter, AWS style)."""
        cap = min(self.max_s, self.base_s * (2 ** (attempt - 1)))
        return (rng or random).uniform(0.0, cap)
