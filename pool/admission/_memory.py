"""In-process store (``memory://``): one process, no leases to expire.

State is one ordered dict of waiters plus a counter per resource. ``_assign`` is
the only state machine: it has no ``await``, applies the grant rule and resolves
the winners' futures, handing them their lease at wake-up time so that nobody can
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
    GLOBAL_RESOURCE,
    bottleneck_capacity,
    estimate_wait_s,
    limit_lookup,
    plan_grants,
)
from ._values import MemoryValues

_TICKETS_EVERY_S = 0.25  # how often the queued waiters' positions and estimates are refreshed


class _Waiter:
    __slots__ = ("future", "resources", "ticket")

    def __init__(self, resources: tuple[str, ...], ticket: WaitTicket) -> None:
        self.resources = resources
        self.ticket = ticket
        self.future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()


class MemoryCoordinator:
    """Admission for one process."""

    store = "memory"

    def __init__(self) -> None:
        self._limits: dict[str, int] = {}
        self._held: dict[str, int] = {}
        self._leases: dict[str, Lease] = {}
        self._waiters: OrderedDict[str, _Waiter] = OrderedDict()
        self._mean_hold_s = 1.0
        self._secret = os.urandom(32)
        self.values = MemoryValues()
        self._keys = itertools.count(1)  # waiter and lease ids: unique in this process
        # Waiters that do not need backend:global: while there is none, a grant pass
        # stops once the global resource is full (see plan_grants' ``all_need``).
        self._no_global: set[str] = set()
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
        key = str(next(self._keys))
        waiter = _Waiter(wanted, ticket or WaitTicket())
        self._waiters[key] = waiter
        if GLOBAL_RESOURCE not in wanted:
            self._no_global.add(key)
        self._set_ticket(waiter, len(self._waiters), limit_lookup(self._limits))  # the last
        self._assign()
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(waiter.future)
        except BaseException as exc:
            position = self._position(key)
            self._waiters.pop(key, None)
            self._no_global.discard(key)
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

    def _grant(self, resources: tuple[str, ...]) -> Lease:
        lease = Lease(str(next(self._keys)), resources)
        self._leases[lease.lease_id] = lease
        for r in resources:
            self._held[r] = self._held.get(r, 0) + 1
        return lease

    def _assign(self) -> None:
        """The grant pass, then the tickets; O(global limit) while every waiter needs
        backend:global (the pool's requests all do), not O(waiters)."""
        limit_of = limit_lookup(self._limits)
        pending = ((k, w.resources) for k, w in self._waiters.items() if not w.future.done())
        all_need = None if self._no_global else GLOBAL_RESOURCE
        for key in plan_grants(pending, self._held, limit_of, all_need=all_need):
            waiter = self._waiters.pop(key)
            self._no_global.discard(key)
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
        for position, waiter in enumerate(self._waiters.values(), start=1):
            self._set_ticket(waiter, position, limit_of)

    def _set_ticket(
        self, waiter: _Waiter, position: int, limit_of: Callable[[str], int]
    ) -> None:
        waiter.ticket.position = position
        capacity = bottleneck_capacity(waiter.resources, limit_of)
        waiter.ticket.estimate_s = estimate_wait_s(position, capacity, self._mean_hold_s)

    def _position(self, key: str) -> int:
        for position, k in enumerate(self._waiters, start=1):
            if k == key:
                return position
        return 0

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
        )

    async def shared_secret(self) -> bytes:
        return self._secret

    async def aclose(self) -> None:
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(PoolClosedError("coordinator closed"))
        self._waiters.clear()


def _granted(future: asyncio.Future[Lease]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None
