"""What each user holds, bounded: open sessions, jobs not yet final (issue 28, finding 8).

An email is a claim, not an identity: without a bound, one caller naming a victim's
email opens that user's sessions and jobs by the hundred. So each user (the keyed hash
of the email within its key; every anonymous caller of one key together as that key's
anonymous user, pool/_consumer.py :func:`identity`) has one shared
value, ``<namespace><user>``: a JSON object *member* → when it was taken (wall clock
seconds), a member being a session's key or a job's id.

* **Taking is atomic, fleet-wide.** :meth:`Holdings.take` adds a member through
  :meth:`SharedValues.update` (a transaction in SQLite, compare-and-set in Redis, the
  event loop in memory), refusing when the user already holds ``limit``. So the bound
  holds across every worker and host that shares the coordinator, exactly: two
  workers taking the last place at once cannot both get it.
* **Members leave by** :meth:`Holdings.drop` (a session closed, a job final). One that
  ended without a drop (its worker died, a session expired unused) is still counted
  until the user reaches the limit: then ``alive`` is asked about each member older
  than ``grace_s`` (younger ones are being set up: a session whose record is not
  written yet), the ended ones are dropped, and the place is asked for once more. A
  count can thus be high for a while (never low): a refusal always looked at every
  member first.
* **The value expires** ``ttl_s`` after its last write; an owner of long-lived members
  re-writes it within that time (:meth:`Holdings.keep`; sessions do it on a call).

Only a refused take reads more than its own value: at most ``limit`` ``alive`` checks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable

from ._consumer import identity
from ._exceptions import UserLimitReached
from .admission import SharedValues

Alive = Callable[[str], Awaitable[float | None]]
"""A member's check: None when it ended, else the seconds it may still last at most
(``math.inf`` when unknown)."""


def _members(raw: str | None) -> dict[str, float]:
    if raw is None:
        return {}
    try:
        found = json.loads(raw)
        return {str(k): float(v) for k, v in found.items()}
    except (ValueError, TypeError, AttributeError):
        return {}  # unreadable: as if nothing were held (the next writes replace it)


class Holdings:
    """The members each user holds in one namespace of the shared values."""

    def __init__(
        self,
        values: Callable[[], SharedValues],
        namespace: str,
        *,
        what: str,
        ttl_s: float,
        grace_s: float,
        clock: Callable[[], float],
        retry_after_s: float = 10.0,
    ) -> None:
        self._values = values
        self._namespace = namespace
        self.what = what  # "sessions", "jobs": in the refusal's reason and message
        self.ttl_s = ttl_s
        self.grace_s = grace_s
        self._clock = clock
        self._retry_after_s = retry_after_s  # when no member says how long it lasts

    def _key(self, user: str | None) -> str:
        return self._namespace + identity(user)  # anonymous: the current key's

    async def held(self, user: str | None) -> dict[str, float]:
        """The members ``user`` holds (None: anonymous), and when each was taken."""
        return _members(await self._values().get(self._key(user)))

    async def take(self, user: str | None, member: str, limit: int | None, alive: Alive) -> None:
        """Add ``member`` to what ``user`` holds; :class:`UserLimitReached` when they
        already hold ``limit`` live members (None: no limit, only counted)."""
        if await self._add(user, member, limit):
            return
        held = await self.held(user)
        now = self._clock()
        lasts: dict[str, float] = {}
        for name, taken in held.items():
            left = math.inf if now - taken < self.grace_s else await alive(name)
            if left is not None:
                lasts[name] = left
        ended = set(held) - set(lasts)
        if ended:
            await self._remove(user, ended)
            if await self._add(user, member, limit):
                return
        finite = [left for left in lasts.values() if math.isfinite(left)]
        wait = min(finite) if finite else self._retry_after_s
        raise UserLimitReached(
            f"this user already holds {limit} open {self.what} (the limit);"
            f" end one or retry later",
            reason=f"too_many_{self.what}",
            limit=limit or 0,
            retry_after_s=max(1.0, wait),
        )

    async def keep(self, user: str | None, member: str) -> None:
        """Count ``member`` again (added if missing, whatever the limit) and renew the
        value's TTL: a long-lived member's owner calls this within every ``ttl_s``."""
        now = self._clock()

        def add(raw: str | None) -> str:
            members = _members(raw)
            members.setdefault(member, now)
            return json.dumps(members)

        await self._values().update(self._key(user), add, self.ttl_s)

    async def drop(self, user: str | None, member: str) -> None:
        """``member`` ended: it no longer counts."""
        await self._remove(user, {member})

    async def _add(self, user: str | None, member: str, limit: int | None) -> bool:
        now = self._clock()
        added = False

        def add(raw: str | None) -> str | None:
            nonlocal added  # pure but for this flag: the last run is the one stored
            members = _members(raw)
            added = member in members or limit is None or len(members) < limit
            if not added:
                return None
            members.setdefault(member, now)
            return json.dumps(members)

        await self._values().update(self._key(user), add, self.ttl_s)
        return added

    async def _remove(self, user: str | None, gone: set[str]) -> None:
        def remove(raw: str | None) -> str | None:
            members = _members(raw)
            if raw is None or not gone & set(members):
                return None
            return json.dumps({k: v for k, v in members.items() if k not in gone})

        await self._values().update(self._key(user), remove, self.ttl_s)
