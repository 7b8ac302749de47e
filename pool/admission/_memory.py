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
import heapq
import itertools
import math
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import cast

from .._exceptions import BusyError, MisuseError, PoolClosedError
from ._protocol import AdmissionSnapshot, Lease, WaitTicket
from ._ready import GrantIndex, Waiter
from ._rule import BATCH, estimate_wait_s, is_private, limit_lookup
from ._values import MemoryValues

_TICKETS_EVERY_S = 0.25  # how often queued waiters' positions and estimates are refreshed
_TICKETS_PER_ROUND = 256  # at most this many per round (each waiter in turn)
_TIMEOUTS_PER_RUN = 256  # waiters timed out per loop iteration, at most


class _TimedOut(Exception):
    """A waiter's deadline passed (set by the store's one timer, not a task's)."""

    def __init__(self, position: int) -> None:
        super().__init__(position)
        self.position = position


class _Waiter(Waiter):
    """A waiter of the index that carries its caller's future and ticket (one object,
    one dict entry per waiter: a cancel touches as few as it can)."""

    __slots__ = ("future", "private", "ticket")

    def __init__(
        self, key: str, resources: tuple[str, ...], seq: int, ticket: WaitTicket, now: float
    ) -> None:
        batch = ticket.priority == BATCH
        super().__init__(key, resources, seq, batch, now + ticket.ages_after_s)
        self.ticket = ticket
        self.private = tuple(r for r in resources if is_private(r))
        self.future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()


class MemoryCoordinator:
    """Admission for one process."""

    store = "memory"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: its values' clock (TTLs)."""
        self._limits: dict[str, int] = {}
        self._held: dict[str, int] = {}
        self._leases: dict[str, Lease] = {}
        self._index = GrantIndex()
        self._mean_hold_s = 1.0
        self._secret = os.urandom(32)
        self.values = MemoryValues(clock)
        self._keys = itertools.count(1)  # waiter and lease ids: unique in this process
        self._turns: deque[str] = deque()  # waiters whose ticket is refreshed, in turn
        self._tickets_timer: asyncio.TimerHandle | None = None
        # private resource ("consumer:...") -> waiters that need it; the shared ones are
        # counted by the index (GrantIndex.queued_counts)
        self._queued: dict[str, int] = {}
        self._batch_waiting = 0
        self._deadlines: list[tuple[float, int, str]] = []  # (when, seq, waiter), lazily
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_at = math.inf

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
        now = time.monotonic()
        waiter = _Waiter(key, wanted, seq, ticket or WaitTicket(), now)
        self._index.insert(waiter, now)
        for r in waiter.private:
            self._queued[r] = self._queued.get(r, 0) + 1
        self._batch_waiting += waiter.batch
        self._assign()
        if not waiter.future.done():
            self._set_ticket(key, waiter)
            self._turns.append(key)
            self._schedule_tickets()
            self._add_deadline(now + timeout, seq, key)
        try:
            # Awaited directly (no shield, no asyncio.timeout: the store keeps one timer
            # for every waiter's deadline). A cancel cancels the future; a grant pass that
            # meets a cancelled one passes its slots on (_assign).
            return await waiter.future
        except _TimedOut as timed_out:  # already out of the queue: _time_out
            raise BusyError(
                f"no capacity within {timeout:.1f}s",
                queue_position=timed_out.position,
                retry_after_s=waiter.ticket.estimate_s or self._mean_hold_s,
            ) from None
        except BaseException:
            self._forget(key)
            if _granted(waiter.future):  # granted before the cancel reached us: pass it on
                self._release_now(waiter.future.result())
            else:
                waiter.future.cancel()
            self._assign()
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
        if len(self._index):
            self._assign()

    def _forget(self, key: str) -> _Waiter | None:
        waiter = cast("_Waiter | None", self._index.remove(key, time.monotonic()))
        if waiter is not None:
            self._unqueue(waiter)
        return waiter

    def _unqueue(self, waiter: _Waiter) -> None:
        for r in waiter.private:
            left = self._queued[r] - 1
            if left:
                self._queued[r] = left
            else:
                del self._queued[r]
        self._batch_waiting -= waiter.batch

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
        unwanted: list[Lease] = []
        for granted in self._index.grant_pass(self._held, limit_of, time.monotonic()):
            waiter = cast(_Waiter, granted)  # out of the index already
            self._unqueue(waiter)
            lease = self._lease(waiter.resources)
            if waiter.future.done():  # cancelled; its task has not run yet: pass it on
                unwanted.append(lease)
            else:
                waiter.future.set_result(lease)
        for lease in unwanted:
            self._release_now(lease)

    # -- deadlines: one timer for every waiter -----------------------------------------------
    def _add_deadline(self, at: float, seq: int, key: str) -> None:
        if not math.isfinite(at):
            return
        heap = self._deadlines
        heapq.heappush(heap, (at, seq, key))
        if len(heap) > 2 * len(self._index) + 64:  # mostly gone: amortized O(1) per push
            heap[:] = [e for e in heap if e[2] in self._index]
            heapq.heapify(heap)
        if heap[0][0] < self._deadline_at:
            self._arm_deadlines()

    def _arm_deadlines(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer, self._deadline_at = None, math.inf
        if self._deadlines:
            at = self._deadlines[0][0]
            delay = max(0.0, at - time.monotonic())
            self._deadline_timer = asyncio.get_running_loop().call_later(delay, self._time_out)
            self._deadline_at = at

    def _time_out(self) -> None:
        """The waiters past their deadline leave the queue now (each tells its position),
        ``_TIMEOUTS_PER_RUN`` at most per loop iteration: the rest in the next ones."""
        self._deadline_timer, self._deadline_at = None, math.inf
        now, heap, timed_out = time.monotonic(), self._deadlines, 0
        while heap and heap[0][0] <= now and timed_out < _TIMEOUTS_PER_RUN:
            _, _, key = heapq.heappop(heap)
            waiter = cast("_Waiter | None", self._index.get(key))
            if waiter is None or waiter.future.done():
                continue  # granted, cancelled or gone meanwhile
            position = self._position(key)[0]
            self._forget(key)
            waiter.future.set_exception(_TimedOut(position))
            timed_out += 1
        if timed_out:
            self._assign()
        self._arm_deadlines()

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
            waiter = cast("_Waiter | None", self._index.get(key))
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
            queued={**self._index.queued_counts(), **self._queued},
            limits=dict(self._limits),
            waiting=len(self._index),
            store=self.store,
            batch_waiting=self._batch_waiting,
        )

    async def shared_secret(self) -> bytes:
        return self._secret

    async def aclose(self) -> None:
        for key in self._index.queued():
            waiter = self._forget(key)
            if waiter is not None and not waiter.future.done():
                waiter.future.set_exception(PoolClosedError("coordinator closed"))
        self._turns.clear()
        if self._tickets_timer is not None:
            self._tickets_timer.cancel()
            self._tickets_timer = None
        self._deadlines.clear()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer, self._deadline_at = None, math.inf


def _granted(future: asyncio.Future[Lease]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None
