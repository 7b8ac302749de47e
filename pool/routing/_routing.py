"""Users → Spaces: sticky pins with a TTL, round-robin for new users, least-loaded
for anonymous callers (SPEC 4.2).

A pin lasts ``ttl`` from the moment it is made and is *not* refreshed by use: a busy
user is re-balanced at most once an hour, which keeps long-lived users from piling
onto whichever Space they happened to get first. Only keyed hashes of emails reach
this module.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
from collections.abc import Callable, Sequence

from cachetools import TTLCache

from .._clock import SYSTEM_CLOCK
from .._consumer import ANONYMOUS  # the user every caller without an email counts as
from .._exceptions import NoHealthySpaceError

__all__ = ["ANONYMOUS", "Router", "user_key"]


def user_key(secret: bytes, email: str, scope: str = "") -> str:
    """The keyed hash that stands for an email within ``scope`` (an API key's id, ""
    without one) everywhere (16 hex chars). The message is the length-prefixed pair, so
    no (scope, email) hashes like another: an email that holds a key id and a ``/`` is
    not that key's user (issue 38)."""
    parts = (scope.encode(), email.strip().lower().encode())
    message = b"".join(b"%d:%s," % (len(part), part) for part in parts)
    return hmac.new(secret, message, hashlib.sha256).hexdigest()[:16]


class Router:
    """Chooses the Space for a request and remembers user pins."""

    def __init__(
        self,
        *,
        ttl_s: float,
        max_users: int = 100_000,
        clock: Callable[[], float] = SYSTEM_CLOCK.now,
    ) -> None:
        self._pins: TTLCache[str, str] = TTLCache(maxsize=max_users, ttl=ttl_s, timer=clock)
        self._rr = itertools.count()

    @property
    def assignments(self) -> int:
        self._pins.expire()
        return len(self._pins)

    def pinned(self, user: str) -> str | None:
        return self._pins.get(user)

    def candidates(
        self,
        user: str | None,
        healthy: Sequence[str],
        load: Callable[[str], float],
    ) -> list[str]:
        """Spaces to try, best first: pin / round-robin / least-loaded, then the rest."""
        if not healthy:
            raise NoHealthySpaceError("no healthy Space is available", retry_after_s=1.0)
        by_load = sorted(healthy, key=load)
        if user is None:
            return by_load
        pinned = self._pins.get(user)
        if pinned is not None and pinned in healthy:
            first = pinned
        else:
            first = healthy[next(self._rr) % len(healthy)]
            self._pins[user] = first
        return [first, *(s for s in by_load if s != first)]

    def order(
        self, user: str | None, healthy: Sequence[str], load: Callable[[str], float]
    ) -> list[str]:
        """The Spaces a waiter may take, best first, pinning nobody (issue 31): the
        user's pin alone; a new user's round-robin turn first, then the rest in turn;
        an anonymous caller's least loaded first. A new user is pinned where it is
        admitted (:meth:`repin`), among the replicas able to start it then."""
        if not healthy:
            raise NoHealthySpaceError("no healthy Space is available", retry_after_s=1.0)
        if user is None:
            return sorted(healthy, key=load)
        pinned = self._pins.get(user)
        if pinned is not None and pinned in healthy:
            return [pinned]
        start = next(self._rr) % len(healthy)
        return [*healthy[start:], *healthy[:start]]

    def repin(self, user: str, space: str) -> None:
        """Record that ``user`` was served by ``space`` after a failover."""
        if self._pins.get(user) != space:
            self._pins[user] = space
