"""In-process store (``memory://``): one process, no leases to expire.

State is one ordered dict of waiters (arrival order), the same waiters grouped by
lane and class (:func:`~pool.admission._rule.lane_of`, in rank order) and a counter
per resource. ``_assign`` is the only state machine: it has no ``await``, applies the
grant rule and resolves the winners' futures, handing them their lease at wake-up
time so that nobody can
jump the queue between the wake-up and the waiter running (trio's parking lot).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from .._exceptions import BusyError, MisuseError, PoolClosedError
from ._protocol import AdmissionSnapshot, Lease, WaitTicket
from ._rule import (
    RANK,
    Entry,
    bottleneck_capacity,
    estimate_wait_s,
    lane_of,
    lane_open,
    limit_lookup,
    newcomer_position,
    plan_grants,
    queue_positions,
    rank_of,
)
from ._values import MemoryValues

_TICKETS_EVERY_S = 0.25  # how often the queued waiters' positions and estimates are refreshed


class _Waiter:
    __slots__ = ("ages_at", "future", "lane", "resources", "seq", "ticket")

    def __init__(self, resources: tuple[str, ...], ticket: WaitTicket, seq: int) -> None:
        self.resources = resources
        self.ticket = ticket
        self.seq = seq
        self.ages_at = time.monotonic() + ticket.ages_after_s
        self.lane = (lane_of(resources), RANK[ticket.priority])
        self.future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()

    def entry(self, key: str, now: float) -> Entry[str]:
        return key, self.resources, (rank_of(self.ticket.priority, self.ages_at, now), self.seq)


class MemoryCoordinator:
    """Admission for one process."""

    store = "memory"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: its values' clock (TTLs)."""
        self._limits: dict[str, int] = {}
        self._held: dict[str, int] = {}
        self._leases: dict[str, Lease] = {}
        self._waiters: OrderedDict[str, _Waiter] = OrderedDict()
        self._mean_hold_s = 1.0
        self._secret = os.urandom(32)
        self.values = MemoryValues(clock)
        self._keys = itertools.count(1)  # waiter and lease ids: unique in this process
        # The waiters by (lane, class), each in arrival (= rank) order: plan_grants'
        # lanes, so that a hand-off does not read the waiters a full Space blocks.
        self._lanes: dict[tuple[str, int], OrderedDict[str, _Waiter]] = {}
        self._tickets_due = 0.0  # monotonic time of the next ticket refresh
        self._tickets_timer: asyncio.TimerHandle | None = None

    async def acquire(
        self, resources: Sequence[str], *, timeout: float, ticket: WaitTicket | None = None
    ) -> Lease:
        wanted = tuple(resources)
        if not self._waiters:
            # Fast path: nobody waits, so FIFO cannot be broken; grant without a waiter,
            # a future or a timeout if every resource has a free slot.
            limit_of = limit_lookup(self._limits)
            if all(self._held.get(r, 0) < limit_of(r) for r in wanted):
                return self._grant(wanted)
        seq = next(self._keys)
        key = str(seq)
        waiter = _Waiter(wanted, ticket or WaitTicket(), seq)
        self._waiters[key] = waiter
        self._lanes.setdefault(waiter.lane, OrderedDict())[key] = waiter
        self._assign()
        if not waiter.future.done():
            self._set_newcomer_ticket(waiter)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(waiter.future)
        except BaseException as exc:
            position = self._position(key)
            self._forget(key)
            if _granted(waiter.future):
                # Granted at the same moment we gave up: pass the slots on.
                if isinstance(exc, TimeoutError):
                    return waiter.future.result()
                self._release_now(waiter.future.result())
            else:
                waiter.future.cancel()
            self._assign()
            if isinstance(exc, TimeoutError):
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
        held_s = time.monotonic() - lease.granted_at
        self._mean_hold_s = 0.8 * self._mean_hold_s + 0.2 * max(held_s, 0.0)
        if self._waiters:
            self._assign()

    def _forget(self, key: str) -> _Waiter | None:
        waiter = self._waiters.pop(key, None)
        if waiter is not None:
            lane = self._lanes[waiter.lane]
            del lane[key]
            if not lane:
                del self._lanes[waiter.lane]
        return waiter

    def _grant(self, resources: tuple[str, ...]) -> Lease:
        lease = Lease(str(next(self._keys)), resources)
        self._leases[lease.lease_id] = lease
        for r in resources:
            self._held[r] = self._held.get(r, 0) + 1
        return lease

    def _assign(self) -> None:
        """The grant pass over the lanes, then the tickets; flat in the queue length."""
        limit_of = limit_lookup(self._limits)
        now = time.monotonic()
        lanes = [
            (w.entry(k, now) for k, w in lane.items() if not w.future.done())
            for (key, _rank), lane in self._lanes.items()
            if lane_open(key, self._held, limit_of)
        ]
        for key in plan_grants(lanes, self._held, limit_of):
            waiter = self._forget(key)
            assert waiter is not None
            waiter.future.set_result(self._grant(waiter.resources))
        # Positions only fall while a waiter waits, so a ticket that is not refreshed
        # overstates its wait a little; refreshing every ticket on every hand-off would
        # make each hand-off O(waiters). A newcomer's ticket is set when it queues.
        if not self._waiters or self._tickets_timer is not None:
            return
        delay = self._tickets_due - time.monotonic()
        if delay <= 0:
            self._refresh_tickets()
        else:
            self._tickets_timer = asyncio.get_running_loop().call_later(
                delay, self._refresh_tickets
            )

    def _refresh_tickets(self) -> None:
        self._tickets_timer = None
        self._tickets_due = time.monotonic() + _TICKETS_EVERY_S
        limit_of = limit_lookup(self._limits)
        now = time.monotonic()
        entries = [w.entry(k, now) for k, w in self._waiters.items()]
        for key, position in queue_positions(entries, self._held, limit_of, self._waiters).items():
            waiter = self._waiters[key]
            capacity = bottleneck_capacity(waiter.resources, limit_of)
            estimate = estimate_wait_s(position, capacity, self._mean_hold_s)
            waiter.ticket.update(position=position, estimate_s=estimate)

    def _set_newcomer_ticket(self, waiter: _Waiter) -> None:
        """The ticket of the waiter that arrived last, in O(lanes)."""
        limit_of = limit_lookup(self._limits)
        sizes = [(lane, rank, len(ws) - (ws is self._lanes[waiter.lane]))
                 for (lane, rank), ws in self._lanes.items()]  # fmt: skip
        position = newcomer_position(sizes, *waiter.lane, self._held, limit_of)
        capacity = bottleneck_capacity(waiter.resources, limit_of)
        estimate = estimate_wait_s(position, capacity, self._mean_hold_s)
        waiter.ticket.update(position=position, estimate_s=estimate)

    def _position(self, key: str) -> int:
        now = time.monotonic()
        entries = [w.entry(k, now) for k, w in self._waiters.items()]
        return queue_positions(entries, self._held, limit_lookup(self._limits), [key]).get(key, 0)

    async def set_limits(self, limits: dict[str, int]) -> None:
        self._limits.update(limits)
        self._assign()

    async def snapshot(self) -> AdmissionSnapshot:
        queued: dict[str, int] = {}
        for w in self._waiters.values():
            for r in w.resources:
                queued[r] = queued.get(r, 0) + 1
        return AdmissionSnapshot(
            held=dict(self._held),
            queued=queued,
            limits=dict(self._limits),
            waiting=len(self._waiters),
            store=self.store,
            batch_waiting=sum(w.lane[1] for w in self._waiters.values()),
        )

    async def shared_secret(self) -> bytes:
        return self._secret

    async def aclose(self) -> None:
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(PoolClosedError("coordinator closed"))
        self._waiters.clear()
        self._lanes.clear()


def _granted(future: asyncio.Future[Lease]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None
