"""In-process store (``memory://``): one process, no leases to expire.

State is one dict of waiters, the same waiters in a :class:`~._ready.GrantIndex`
(lanes parked under the resources that block them, positions as order statistics)
and a counter per resource. ``_assign`` is the only state machine: it has no
``await``, applies the grant rule and resolves the winners' futures, handing them their
lease at wake-up time so that nobody can jump the queue between the wake-up and the
waiter running (trio's parking lot). Each operation touches O(1) waiters and O(log n)
index entries, whatever the queue, the fleet or a consumer's backlog (issue 39).

Tickets: a newcomer's position is set when it queues; then, every
``_TICKETS_EVERY_S``, the positions of at most ``_TICKETS_PER_ROUND`` waiters are
recomputed, in turn (each O(log n)), so that 10,000 waiters cost the event loop the same
per round as 300.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import deque
from collections.abc import Callable, Sequence

from .._exceptions import BusyError, MisuseError, PoolClosedError
from ._protocol import AdmissionSnapshot, Lease, WaitTicket
from ._ready import GrantIndex
from ._rule import BATCH, estimate_wait_s, limit_lookup
from ._values import MemoryValues

_TICKETS_EVERY_S = 0.25  # how often queued waiters' positions and estimates are refreshed
_TICKETS_PER_ROUND = 256  # at most this many per round (each waiter in turn)


class _Waiter:
    __slots__ = ("future", "resources", "ticket")

    def __init__(self, resources: tuple[str, ...], ticket: WaitTicket) -> None:
        self.resources = resources
        self.ticket = ticket
        self.future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()


class MemoryCoordinator:
    """Admission for one process."""

    store = "memory"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: its values' clock (TTLs)."""
        self._limits: dict[str, int] = {}
        self._held: dict[str, int] = {}
        self._leases: dict[str, Lease] = {}
        self._waiters: dict[str, _Waiter] = {}
        self._index = GrantIndex()
        self._mean_hold_s = 1.0
        self._secret = os.urandom(32)
        self.values = MemoryValues(clock)
        self._keys = itertools.count(1)  # waiter and lease ids: unique in this process
        self._turns: deque[str] = deque()  # waiters whose ticket is refreshed, in turn
        self._tickets_timer: asyncio.TimerHandle | None = None
        self._queued: dict[str, int] = {}  # resource -> waiters that need it
        self._batch_waiting = 0

    @property
    def work(self) -> int:
        """Entries of the index touched so far (tests/admission/test_work.py)."""
        return self._index.work

    async def acquire(
        self, resources: Sequence[str], *, timeout: float, ticket: WaitTicket | None = None
    ) -> Lease:
        wanted = tuple(resources)
        # Fast path: between two passes every waiter is parked under a full resource it
        # needs (the index's invariant), so a newcomer with a free slot of each of its
        # resources overtakes nobody the rule would serve first: grant it without a
        # waiter, a future or a timeout, as the pass would.
        limit_of = limit_lookup(self._limits)
        if all(self._held.get(r, 0) < limit_of(r) for r in wanted):
            return self._grant(wanted)
        seq = next(self._keys)
        key = str(seq)
        ticket = ticket or WaitTicket()
        waiter = _Waiter(wanted, ticket)
        self._waiters[key] = waiter
        now = time.monotonic()
        batch = ticket.priority == BATCH
        self._index.add(key, wanted, seq, batch=batch, ages_at=now + ticket.ages_after_s,
                        now=now)  # fmt: skip
        for r in wanted:
            self._queued[r] = self._queued.get(r, 0) + 1
        self._batch_waiting += batch
        self._assign()
        if not waiter.future.done():
            self._set_ticket(key, waiter)
            self._turns.append(key)
            self._schedule_tickets()
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(waiter.future)
        except BaseException as exc:
            # Only a timeout tells its position (BusyError); a cancel does not compute it.
            timed_out = isinstance(exc, TimeoutError)
            position = self._position(key)[0] if timed_out else 0
            self._forget(key)
            if _granted(waiter.future):
                # Granted at the same moment we gave up: pass the slots on.
                if timed_out:
                    return waiter.future.result()
                self._release_now(waiter.future.result())
            else:
                waiter.future.cancel()
            self._assign()
            if timed_out:
                raise BusyError(
                    f"no capacity within {timeout:.1f}s",
                    queue_position=position,
                    retry_after_s=waiter.ticket.estimate_s or self._mean_hold_s,
                ) from None
            raise

    async def release(self, lease: Lease) -> None:
        self._release_now(lease)

    def _release_now(self, lease: Lease) -> None:
        if self._leases.pop(lease.lease_id, None) is None:
            raise MisuseError(f"lease {lease.lease_id} is not held here")
        lease.mark_released()
        for r in lease.resources:
            left = self._held.get(r, 0) - 1
            if left > 0:
                self._held[r] = left
            else:
                self._held.pop(r, None)
        self._index.freed(lease.resources)
        held_s = time.monotonic() - lease.granted_at
        self._mean_hold_s = 0.8 * self._mean_hold_s + 0.2 * max(held_s, 0.0)
        if self._waiters:
            self._assign()

    def _forget(self, key: str) -> _Waiter | None:
        waiter = self._waiters.pop(key, None)
        if waiter is not None:
            self._index.remove(key, time.monotonic())
            self._unqueue(waiter)
        return waiter

    def _unqueue(self, waiter: _Waiter) -> None:
        for r in waiter.resources:
            left = self._queued[r] - 1
            if left:
                self._queued[r] = left
            else:
                del self._queued[r]
        self._batch_waiting -= waiter.ticket.priority == BATCH

    def _grant(self, resources: tuple[str, ...]) -> Lease:
        lease = self._lease(resources)
        for r in resources:
            self._held[r] = self._held.get(r, 0) + 1
        return lease

    def _lease(self, resources: tuple[str, ...]) -> Lease:
        lease = Lease(str(next(self._keys)), resources)
        self._leases[lease.lease_id] = lease
        return lease

    def _assign(self) -> None:
        """The grant pass over the index (it counts the grants in ``_held``)."""
        limit_of = limit_lookup(self._limits)
        for granted in self._index.grant_pass(self._held, limit_of, time.monotonic()):
            waiter = self._waiters.pop(granted.key)
            self._unqueue(waiter)
            waiter.future.set_result(self._lease(waiter.resources))

    def _schedule_tickets(self) -> None:
        if self._tickets_timer is None and self._turns:
            loop = asyncio.get_running_loop()
            self._tickets_timer = loop.call_later(_TICKETS_EVERY_S, self._refresh_tickets)

    def _refresh_tickets(self) -> None:
        """Positions only fall while a waiter waits: a ticket not refreshed yet overstates
        its wait a little. Each round refreshes the next waiters in turn."""
        self._tickets_timer = None
        budget = _TICKETS_PER_ROUND
        while budget and self._turns:
            key = self._turns.popleft()
            waiter = self._waiters.get(key)
            if waiter is None or waiter.future.done():
                continue  # gone: dropped from the turns
            budget -= 1
            self._set_ticket(key, waiter)
            self._turns.append(key)
        self._schedule_tickets()

    def _set_ticket(self, key: str, waiter: _Waiter) -> None:
        position, capacity = self._position(key)
        estimate = estimate_wait_s(position, capacity, self._mean_hold_s)
        waiter.ticket.update(position=position, estimate_s=estimate)

    def _position(self, key: str) -> tuple[int, int]:
        limit_of = limit_lookup(self._limits)
        return self._index.position(key, self._held, limit_of, time.monotonic())

    async def set_limits(self, limits: dict[str, int]) -> None:
        self._limits.update(limits)
        self._index.wake_all()
        self._assign()

    async def snapshot(self) -> AdmissionSnapshot:
        return AdmissionSnapshot(
            held=dict(self._held),
            queued=dict(self._queued),
            limits=dict(self._limits),
            waiting=len(self._waiters),
            store=self.store,
            batch_waiting=self._batch_waiting,
        )

    async def shared_secret(self) -> bytes:
        return self._secret

    async def aclose(self) -> None:
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(PoolClosedError("coordinator closed"))
        for key in list(self._waiters):
            self._forget(key)
        self._turns.clear()
        if self._tickets_timer is not None:
            self._tickets_timer.cancel()
            self._tickets_timer = None


def _granted(future: asyncio.Future[Lease]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None
