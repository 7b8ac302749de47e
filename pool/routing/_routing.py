"""Users → Spaces: one pin per user and app, kept where the whole fleet sees it, with a
TTL; round robin for new users, least loaded for anonymous callers (SPEC 4.2).

**Where a pin lives.** In the coordinator's shared values (``pin:<user key>``, the user
key being :meth:`Apps.pin_key <pool.routing._apps.Apps.pin_key>`'s: a keyed hash, in its
app when the pool has several), so that every worker and host of a fleet routes a user
to the same Space — a pin kept in each process flipped between replicas (issue 37).

**How a pin is made.** Never at routing: a user not pinned yet waits for every replica
able to take it (late binding, pool/_attempt.py), and the first of its waiters to be
admitted *claims* the pin (:meth:`Router.claim`, one compare-and-set): the Space that
admitted it, unless another waiter of the user — in this process or another — claimed
one first; that waiter then gives its grant back and keeps its place on the pinned
Space. So a user's calls of one app never run on two replicas at once, and a pin is
decided once.

**How a pin moves.** Only by a failover (a claim that names the pin it replaces:
that Space could not take the call) or by its expiry: a pin lasts ``ttl`` from the
moment it is made and is *not* refreshed by use, so a busy user is re-balanced at most
once an hour. Only keyed hashes of emails reach this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import itertools
from collections.abc import AsyncIterator, Callable, Sequence

from cachetools import TTLCache

from .._clock import SYSTEM_CLOCK
from .._consumer import ANONYMOUS  # the user every caller without an email counts as
from .._exceptions import NoHealthySpaceError, PoolClosedError
from ..admission import Changed, SharedValues

__all__ = ["ANONYMOUS", "PIN_PREFIX", "Router", "user_key"]

PIN_PREFIX = "pin:"


def user_key(secret: bytes, email: str, scope: str = "") -> str:
    """The keyed hash that stands for an email within ``scope`` (an API key's id, ""
    without one) everywhere (16 hex chars). The message is the length-prefixed pair, so
    no (scope, email) hashes like another: an email that holds a key id and a ``/`` is
    not that key's user (issue 38)."""
    parts = (scope.encode(), email.strip().lower().encode())
    message = b"".join(b"%d:%s," % (len(part), part) for part in parts)
    return hmac.new(secret, message, hashlib.sha256).hexdigest()[:16]


class Router:
    """Orders the Spaces of a request and keeps the fleet's user pins."""

    def __init__(
        self,
        *,
        ttl_s: float,
        values: SharedValues | None = None,
        max_users: int = 100_000,
        clock: Callable[[], float] = SYSTEM_CLOCK.now,
    ) -> None:
        """``values``: the coordinator's shared values, where the pins live (or given
        by :meth:`use` once the coordinator is open)."""
        self._ttl_s = ttl_s
        self._shared = values
        # The pins this process read or made, for pool-stats' count of pinned users
        # (the fleet's count is the sum of the processes' published counts, at most).
        self._seen: TTLCache[str, str] = TTLCache(maxsize=max_users, ttl=ttl_s, timer=clock)
        self._rr = itertools.count()
        self._reading: dict[str, asyncio.Future[str | None]] = {}  # pin reads in flight
        self._watching: dict[str, set[Changed]] = {}  # this process's pin watchers

    def use(self, values: SharedValues) -> None:
        """Keep the pins in ``values`` (the pool's coordinator, once open)."""
        self._shared = values

    def _values(self) -> SharedValues:
        if self._shared is None:
            raise PoolClosedError("pool not started")
        return self._shared

    @property
    def assignments(self) -> int:
        self._seen.expire()
        return len(self._seen)

    async def pinned(self, user: str) -> str | None:
        """The Space ``user`` (a pin key) is pinned to, fleet-wide; None: not pinned.

        Calls of one user reading at once share one read, and resume in the order they
        asked: a user's calls reach the admission queue in the order they were made
        (separate reads come back in any order)."""
        reading = self._reading.get(user)
        if reading is None:
            reading = asyncio.ensure_future(self._values().get(PIN_PREFIX + user))
            self._reading[user] = reading
            reading.add_done_callback(functools.partial(self._read, user))
        return await asyncio.shield(reading)

    def _read(self, user: str, reading: asyncio.Future[str | None]) -> None:
        self._reading.pop(user, None)
        if reading.cancelled() or reading.exception() is not None:
            return  # every caller sees it (or none is left to)
        space = reading.result()
        if space is not None and self._seen.get(user) != space:
            self._seen[user] = space

    async def claim(self, user: str, space: str, replacing: str | None = None) -> tuple[str, bool]:
        """Pin ``user`` to ``space``, which just admitted one of its calls, unless it is
        pinned elsewhere already; a pin equal to ``replacing`` (the Space the call
        failed over from) is replaced. Returns the pin as stored afterwards and whether
        this call made it."""

        wrote = False

        def pin(current: str | None) -> str | None:
            nonlocal wrote  # the last run is the one stored (a lost race runs it again)
            wrote = current is None or (current == replacing and current != space)
            return space if wrote else None

        stored = await self._values().update(PIN_PREFIX + user, pin, self._ttl_s)
        holder = space if stored is None else stored  # None only when the store lost it
        self._seen[user] = holder
        for changed in self._watching.get(user, ()):
            changed.set()
        return holder, wrote and holder == space

    @contextlib.asynccontextmanager
    async def watch(self, user: str) -> AsyncIterator[Changed]:
        """Wake-ups for each change of ``user``'s pin, by any process of the fleet, and
        at once for a claim made in this process (not a store's round trip later)."""
        async with self._values().watch(PIN_PREFIX + user) as changed:
            here = self._watching.setdefault(user, set())
            here.add(changed)
            try:
                yield changed
            finally:
                here.discard(changed)
                if not here:
                    self._watching.pop(user, None)

    def order(
        self,
        user: str | None,
        pinned: str | None,
        healthy: Sequence[str],
        load: Callable[[str], float],
    ) -> list[str]:
        """The Spaces a waiter may take, best first, pinning nobody (issue 31): the
        user's pin alone (``pinned``, when it is among ``healthy``); a new user's round
        robin turn first, then the rest in turn; an anonymous caller's least loaded
        first. A new user is pinned where it is admitted (:meth:`claim`)."""
        if not healthy:
            raise NoHealthySpaceError("no healthy Space is available", retry_after_s=1.0)
        if user is None:
            return sorted(healthy, key=load)
        if pinned is not None and pinned in healthy:
            return [pinned]
        start = next(self._rr) % len(healthy)
        return [*healthy[start:], *healthy[:start]]
