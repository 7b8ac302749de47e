"""Hooks: the pool reports what happens; observers (metrics, logs) subscribe.

The core never imports prometheus_client (stamina's instrumentation pattern): it
calls each hook with a frozen :class:`PoolEvent`. Events carry Space names and
outcome classes only — never users, payloads or results.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

EventKind = Literal[
    "admitted",  # a request got its slots; seconds = time waited
    "busy",  # a request gave up waiting; outcome = reason
    "finished",  # a lease ended; outcome = "ok" or an error kind; seconds = time held
    "health",  # one probe; outcome = "ok" | "failed" | "restarted"
    "assignment",  # a user was pinned or moved to a Space
    "failover",  # a Space was skipped; outcome = the reason (failure kind, breaker_open, …)
    "window",  # the adaptive window moved; outcome = "increase" | "decrease"; value = window
    "breaker",  # the breaker changed; outcome = "open" | "half_open" | "closed"
    "retry",  # a request is tried again; outcome = the failure kind that caused it
    "provider_error",  # a provider failure; outcome = its kind (timeout, queue_full, …)
    "policy",  # refused before sending; outcome = the reason code
    "wake",  # outcome = "started" | "awake" | "timeout"; seconds = time spent waking
    "pause",  # the pool paused an idle Space (outcome = "paused") or failed to ("failed")
    "lease_lost",  # a running request's lease was lost and its work fenced; outcome = why
]


@dataclass(frozen=True)
class PoolEvent:
    kind: EventKind
    space: str | None = None
    outcome: str | None = None
    seconds: float = 0.0
    value: float | None = None


Hook = Callable[[PoolEvent], None]
_log = logging.getLogger("spacepool")


def emit(hooks: list[Hook], event: PoolEvent) -> None:
    """Call every hook; a failing observer never breaks a request."""
    for hook in hooks:
        try:
            hook(event)
        except Exception:
            _log.exception("pool hook failed on %s", event.kind)
