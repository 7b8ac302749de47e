"""The one retry policy: bounded attempts, exponential backoff with full jitter.

It repeats calls (:meth:`RetryPolicy.should_retry`) and connection opens
(:meth:`RetryPolicy.should_reopen`); which failure kinds qualify is the failure table's
(:mod:`pool._failures`) ``retry`` and ``reopen`` columns. A call is repeated only when
that is safe: the Space never accepted it (queue full, 429, connection refused —
``before_accept``), or the caller said the call is idempotent (``safe_to_retry``). A job
the Space already started (a dropped stream, a read timeout, a 5xx mid-job) may have
had effects, so it is not repeated behind the caller's back. Caller errors and policy
refusals are never retried: they would fail the same way.

A refusal for want of room (:meth:`RetryPolicy.should_requeue`: the Space's own queue is
full, or the caller's own share of the Space is taken) is not a failed attempt: the
call waits in the pool's queue again, after a short backoff
(:meth:`RetryPolicy.requeue_delay`), until its queue timeout (pool/_request.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ._exceptions import BusyError, PoolError, UpstreamTransportError
from ._failures import failure


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` in all (1 = no retry); delays ``base_s·2^n`` capped, fully jittered."""

    attempts: int = 3
    base_s: float = 0.25
    max_s: float = 5.0
    requeue_max_s: float = 2.0  # the longest backoff before a refused call waits again

    def should_retry(self, error: PoolError, attempt: int, *, safe_to_retry: bool) -> bool:
        """Whether attempt number ``attempt`` (1-based), which failed with ``error``, may be
        followed by another."""
        if attempt >= self.attempts or not failure(error.kind).retry:
            return False
        return isinstance(error, UpstreamTransportError) and (error.before_accept or safe_to_retry)

    def should_reopen(self, error: PoolError, attempt: int) -> bool:
        """Whether opening a connection, which failed so on attempt ``attempt``, may be
        tried again."""
        return attempt < self.attempts and failure(error.kind).reopen

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt`` (full jitter, AWS style)."""
        cap = min(self.max_s, self.base_s * (2 ** (attempt - 1)))
        return (rng or random).uniform(0.0, cap)

    def should_requeue(self, error: BaseException) -> bool:
        """Whether ``error`` refused the call for want of room before anything ran: the
        Space's own queue is full (kind ``queue_full``), or the caller found its own
        share of the Space taken (a :class:`BusyError` with reason ``no_room``). Such a
        call waits in the pool's queue again, within its queue timeout; not an attempt."""
        if isinstance(error, UpstreamTransportError):
            return error.kind == "queue_full"
        return type(error) is BusyError and error.reason == NO_ROOM

    def requeue_delay(self, refusal: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before refused call ``refusal`` (1-based) waits again (full
        jitter, at most :attr:`requeue_max_s`)."""
        cap = min(self.requeue_max_s, self.max_s, self.base_s * (2 ** (refusal - 1)))
        return (rng or random).uniform(0.0, cap)


NO_ROOM = "no_room"
"""The :class:`BusyError` reason of a caller that found its own share of the admitted
Space taken (the Gradio front's share of a Space's connections): the call waits again."""
