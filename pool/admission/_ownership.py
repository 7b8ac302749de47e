"""One ownership mechanism: a record owned by one worker, renewed by a heartbeat,
lost after a TTL, fenced on every write, reclaimed from an owner that is gone.

Two kinds of things in a fleet belong to one process at a time and must survive
that process dying or freezing: admission's leases and queue entries
(:mod:`pool.admission._lease_keeper`, kept by the store's scripts and transactions)
and the service's durable jobs (``app/jobs/_shared.py``, ``app/jobs/_reclaim.py``, kept in
the shared values). Both follow the same rules, and the rules live here once:

* **Heartbeat** (:class:`Heartbeat`). An owner renews what it owns every third of
  the TTL, at a fixed rate however long a renewal took; after a failed renewal it
  tries again soon (a third of that, at most 0.5 s), as its TTL is running out.
* **TTL.** What an owner stops renewing is anybody's to reclaim one TTL later;
  nobody has to be told. Leases: the store drops expired entries. Jobs: the owner's
  liveness key (:class:`Owners`) expires, and the fleet's sweep reclaims its jobs.
* **Fencing token** (:func:`fenced`). An owned record names its owner and a token
  (``fence``: a number raised by each takeover); a write states the owner and token
  it holds and is refused when the record has another, or is closed. So an owner
  that froze past its TTL and wakes up never overwrites what the fleet decided:
  it finds its write refused and stops. (A lease's token is its id: the store
  refuses to renew an id it dropped, and the holder fences itself.)
* **Reclaim** (:func:`reclaimable`, :func:`taken_over`). A record whose owner's
  liveness is gone, or which is past its deadline by a TTL, is taken over with a
  compare-and-set that raises the token: one taker wins.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._values import SharedValues, Update

RETRY_CAP_S = 0.5
"""A failed renewal is tried again after a third of the period, at most this long."""


class Heartbeat:
    """The renewal rhythm of an owner whose TTL is ``ttl_s``."""

    def __init__(
        self, ttl_s: float, *, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.period_s = ttl_s / 3
        self.retry_s = min(self.period_s / 3, RETRY_CAP_S)
        self._sleep = sleep  # tests pass one that records the delays

    async def run(
        self,
        beat: Callable[[], Awaitable[None]],
        *,
        failed: Callable[[Exception], None],
        ok: Callable[[], None] = lambda: None,
        errors: tuple[type[Exception], ...] = (Exception,),
        first_now: bool = False,
    ) -> None:
        """Call ``beat`` every period until cancelled; ``ok`` after each success,
        ``failed`` with each error of ``errors`` (the next beat comes after ``retry_s``
        then); other errors end it."""
        delay = 0.0 if first_now else self.period_s
        while True:
            await self._sleep(delay)
            started = time.monotonic()
            try:
                await beat()
            except errors as exc:
                failed(exc)
                delay = self.retry_s
            else:  # a fixed rate, however long the renewal took (a loaded loop)
                ok()
                delay = max(0.0, started + self.period_s - time.monotonic())


@dataclass(frozen=True)
class Holder:
    """Who may write an owned record: its owner and the token it holds."""

    owner: str | None
    fence: int = 0


def holder_of(record: Mapping[str, Any]) -> Holder:
    return Holder(record.get("owner"), int(record.get("fence") or 0))


def fenced(new: str, holder: Holder, *, closed: Callable[[Mapping[str, Any]], bool]) -> Update:
    """The compare-and-set of an owned record (for :meth:`SharedValues.update`): write
    ``new`` if the record is absent (or unreadable), or still ``holder``'s and not
    ``closed``; else leave it (the write is refused: somebody took the record over)."""

    def swap(current: str | None) -> str | None:
        if current is None:
            return new
        try:
            held = json.loads(current)
            if holder_of(held) == holder and not closed(held):
                return new
        except (ValueError, AttributeError, TypeError):
            return new
        return current if current == new else None

    return swap


async def write_fenced(
    values: SharedValues,
    key: str,
    new: str,
    holder: Holder,
    *,
    ttl_s: float,
    closed: Callable[[Mapping[str, Any]], bool],
) -> bool:
    """Write ``new`` under ``key`` as :func:`fenced` allows; False when refused."""
    stored = await values.update(key, fenced(new, holder, closed=closed), ttl_s=ttl_s)
    return stored == new


def taken_over(record: Mapping[str, Any], holder: Holder) -> bool:
    """Whether ``record`` (as read from the store) is no longer ``holder``'s."""
    return holder_of(record) != holder


class Owners:
    """The liveness of a fleet's owners: ``<prefix><owner>`` exists while its owner
    heartbeats (:meth:`beat`, with the TTL)."""

    def __init__(
        self, values: Callable[[], SharedValues], prefix: str, owner: str, ttl_s: float
    ) -> None:
        self._values = values
        self.prefix = prefix
        self.owner = owner
        self.ttl_s = ttl_s

    async def beat(self) -> None:
        await self._values().put(self.prefix + self.owner, "1", ttl_s=self.ttl_s)

    async def alive(self) -> set[str]:
        found = await self._values().scan(self.prefix)
        return {key[len(self.prefix) :] for key in found}


def reclaimable(
    owner: str | None, deadline: float, *, me: str, alive: set[str], ttl_s: float, now: float
) -> tuple[bool, bool]:
    """(take it, overdue): a record is taken when its owner is gone (another owner's
    heartbeat expired) or when it is past its ``deadline`` by a TTL, whoever owns it."""
    overdue = now > deadline + ttl_s
    if overdue:
        return True, True
    return owner != me and owner not in alive, False
