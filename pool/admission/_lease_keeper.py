"""The process-local half of a shared store: waiters' futures, heartbeat, wake-ups.

SQLite and Redis keep the fleet's state (limits, leases, the FIFO of waiters) and
apply the grant rule atomically, in one transaction or one Lua script. What is left
for each process is the same for both stores, so it lives here once
(:class:`SharedCoordinator`) and a store only implements :class:`SharedStore`:

* **Lease ids are waiter ids.** A granted waiter's entry *becomes* the lease, so a
  process recognises its grants by id, whichever process made them.
* **Every store operation runs a grant pass and reports our winners.** ``enqueue``
  grants at once when there is room (the fast path is one round trip); ``release``,
  ``withdraw`` and ``set_limits`` hand freed slots straight to the head waiters and
  return the ones that belong to this process, which are resolved before the call
  returns. A grant made by *another* process's transaction is discovered by the
  store's push channel (Redis pub/sub) or by the poller.
* **One poller per process**, not one per waiter, runs only while local waiters
  exist. Its interval is the store's: tight for SQLite (there is no push channel),
  slow for Redis (a safety net behind pub/sub). A poll also lets the store reclaim
  expired entries, so no external janitor is needed. A poll names no more than the
  store's ``positions_per_poll`` waiters (those whose position it refreshes, each in
  turn), whatever the process holds.
* **One heartbeat per process** renews the process's liveness each ``lease_ttl/3``,
  whatever it holds, and retries a failed renewal every ``min(lease_ttl/9, 0.5 s)``:
  the rhythm of every owner in the fleet (:mod:`pool.admission._ownership`, which
  durable jobs follow too). Both stores keep one liveness deadline per process; its
  entries live as long as it does. A renewal tells how many entries the store holds
  for the process; only when that is fewer than the process holds are its ids checked
  (the store does that in chunks) and the missing ones fenced or failed. So a cycle
  (a heartbeat, a poll) does the same work with 1 or 10,000 leases and waiters
  (``keeper_work``, tests/admission/test_work.py).
  A SIGKILLed process stops renewing; anybody's next pass reclaims its slots and
  queue entries after ``lease_ttl``.
* **Self-fencing.** Each lease knows its *local expiry*: the send time of the last
  store call that confirmed it (its enqueue, or the last renewal of its process's
  liveness: the store's deadline was set after it) + ``lease_ttl`` − a safety margin
  (:data:`SAFETY_FRACTION` of the TTL, for the clocks' rates and for the time a cancel
  takes to reach the Space). So the local expiry always comes strictly before the
  store's. One timer per process (not the heartbeat task), armed at the earliest
  local expiry, fences the leases whose moment passes unrenewed, and so does a
  renewal that finds one missing in the store: :meth:`Lease.fence` runs the holder's
  callbacks, which cancel the upstream job and make the caller's await raise
  :class:`~pool.LeaseLost`. A loop frozen past the expiry (SIGSTOP, a long stall)
  runs the due timer in its first iteration after resuming, and the handle checks
  the expiry itself before any further step (:meth:`Lease.check`). A fenced lease is
  never renewed nor re-registered, only released.
* **Withdraw is the only way out of the queue.** A waiter that times out or is
  cancelled deletes its entry in the same store operation that tells whether it was
  granted meanwhile: a timed-out waiter then keeps the lease, a cancelled one gives
  it back (STYLE rule 3). Store calls run in tasks awaited through
  ``asyncio.shield``, so a cancelled caller never leaves half an operation behind.
* **Fail closed.** A store error while admitting raises ``BusyError(reason=
  "coordinator_unavailable")``: nothing is admitted without the store, and leases
  already granted keep running. A release (or withdraw) that cannot reach the store
  is logged and its id kept as an *orphan* that the heartbeat retries; as nobody
  renews it any more, the store drops it after ``lease_ttl`` in any case.

The state machine (``_learn``/``_resolve``) has no ``await``; I/O happens around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from .._exceptions import BusyError, MisuseError, PoolClosedError
from .._tasks import cancel_and_wait
from ._ownership import Heartbeat
from ._protocol import AdmissionSnapshot, Lease, Liveness, StoreUnavailable, WaitTicket, new_id
from ._rule import INTERACTIVE, bottleneck_capacity, estimate_wait_s, limit_lookup
from ._values import GuardedValues, SharedValues

_log = logging.getLogger("spacepool.admission")

T = TypeVar("T")

UNAVAILABLE = "coordinator_unavailable"
SAFETY_FRACTION = 0.2
"""The local expiry of a lease comes this fraction of ``lease_ttl`` before the store's."""


@dataclass(frozen=True)
class StoreView:
    """What one store operation learned for this process."""

    granted: frozenset[str] = frozenset()
    """Our waiter ids that are leases now (granted by this pass or an earlier one)."""
    positions: Mapping[str, int] = field(default_factory=dict)
    """Our waiter ids still queued → 1-based position in the fleet-wide queue."""
    limits: Mapping[str, int] | None = None
    mean_hold_s: float | None = None


@dataclass(frozen=True)
class Withdrawn:
    """Outcome of removing a waiter: was it granted before we got there?"""

    granted: bool
    position: int
    view: StoreView


class LocalEntries(Protocol):
    """This process's live entries, for a store that must re-register them."""

    def local_entries(
        self,
    ) -> tuple[list[tuple[str, tuple[str, ...]]], list[tuple[str, tuple[str, ...]]]]:
        """(leases, queued waiters), each as ``(id, resources)``, waiters oldest first."""
        ...

    def entries_lost(self, ids: Iterable[str]) -> None:
        """The store could not take these entries back (their slots were given away)."""
        ...


class SharedStore(Protocol):
    """One fleet-wide store; every mutating call is atomic and runs a grant pass."""

    name: str
    poll_interval_s: float

    @property
    def values(self) -> SharedValues:
        """The same store's shared values (raising :class:`StoreUnavailable`)."""
        ...

    def attach(self, local: LocalEntries) -> None: ...

    async def enqueue(
        self,
        waiter_id: str,
        resources: tuple[str, ...],
        *,
        priority: str = INTERACTIVE,
        ages_after_s: float = 60.0,
    ) -> StoreView:
        """Queue a waiter of class ``priority`` (it ranks as interactive after
        ``ages_after_s``), or grant it at once."""
        ...

    async def withdraw(self, waiter_id: str, *, keep: bool) -> Withdrawn:
        """Delete the waiter; if it was granted, keep the lease or (``keep=False``) free it."""
        ...

    async def release(self, lease_id: str, held_s: float) -> StoreView: ...

    positions_per_poll: int
    """At most this many waiters' positions are refreshed per poll..."""
    positions_every_s: float
    """...and not more often than this."""

    async def poll(self, told: Sequence[str]) -> StoreView:
        """Our waiters granted since the last poll (a bounded read), and the positions of
        ``told`` (at most ``positions_per_poll`` of our waiters); reclaims expired
        entries when due."""
        ...

    async def renew(self, held: int, held_ids: Callable[[], Sequence[str]]) -> set[str]:
        """Push back our liveness (every entry of ours at once); returns the ids the
        store lost. ``held`` is how many entries we hold: only when the store holds
        fewer does it call ``held_ids`` and check them (in chunks)."""
        ...

    async def drop(self, ids: Sequence[str]) -> None:
        """Free these leases and delete these waiters (close), in chunks."""
        ...

    async def set_limits(self, limits: Mapping[str, int]) -> StoreView: ...

    async def snapshot(self) -> AdmissionSnapshot: ...

    async def shared_secret(self) -> bytes: ...

    async def watch(
        self, on_grant: Callable[[Iterable[str]], None], on_resume: Callable[[], None]
    ) -> None:
        """Push channel: call ``on_grant`` with our granted ids; return if there is none."""
        ...

    async def close(self) -> None: ...


class _Waiter:
    __slots__ = ("confirmed_at", "enqueued", "future", "resources", "ticket")

    def __init__(self, resources: tuple[str, ...], ticket: WaitTicket) -> None:
        self.resources = resources
        self.ticket = ticket
        self.enqueued = False
        # Send time of the store call that queued the entry: its deadline in the store,
        # and that of the lease it becomes, is later than this + lease_ttl (and than
        # the process's last renewal + lease_ttl).
        self.confirmed_at = time.monotonic()
        self.future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()


class SharedCoordinator:
    """A :class:`~pool.admission.Coordinator` over a :class:`SharedStore`."""

    store: str

    def __init__(self, backend: SharedStore, *, lease_ttl_s: float) -> None:
        if lease_ttl_s <= 0:
            raise ValueError("lease_ttl_s must be positive")
        self.store = backend.name
        self.lease_ttl_s = lease_ttl_s
        self.safety_margin_s = lease_ttl_s * SAFETY_FRACTION
        self._backend = backend
        self._waiters: dict[str, _Waiter] = {}
        self._enqueued = 0  # of _waiters, those the store has confirmed
        self._turns: deque[str] = deque()  # queued waiters whose positions are told, in turn
        self._next_positions = 0.0
        self._leases: dict[str, Lease] = {}
        self._live_leases = 0  # of _leases, those not lost
        # The process's liveness: every lease's local expiry is at least this one's.
        self._liveness = Liveness()
        self._renewed_at = -math.inf  # send time of the last renewal that confirmed it
        # Live leases whose own expiry is later than the process's (granted since the
        # last renewal): id -> own expiry, and a heap of them; the others are "covered".
        self._young: dict[str, float] = {}
        self._young_heap: list[tuple[float, str]] = []
        self._fence_timer: asyncio.TimerHandle | None = None
        self._fence_at = math.inf
        self.keeper_work = 0
        """Entries the heartbeat and the poller touched (tests/admission/test_work.py)."""
        self._orphans: set[str] = set()
        self._limits: dict[str, int] = {}
        self._mean_hold_s = 1.0
        self._closed = False
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight: set[asyncio.Task[Any]] = set()
        self._has_waiters = asyncio.Event()
        self._poll_now = asyncio.Event()
        self._reachable = True
        self.values: SharedValues = GuardedValues(backend.values, self._ask)
        backend.attach(self)

    # -- the protocol ----------------------------------------------------------------------
    async def acquire(
        self, resources: Sequence[str], *, timeout: float, ticket: WaitTicket | None = None
    ) -> Lease:
        self._start()
        deadline = asyncio.get_running_loop().time() + timeout
        key = new_id()
        waiter = _Waiter(tuple(resources), ticket or WaitTicket())
        self._waiters[key] = waiter
        sent = time.monotonic()
        enqueue = self._spawn(self._backend.enqueue(
            key, waiter.resources, priority=waiter.ticket.priority,
            ages_after_s=waiter.ticket.ages_after_s,
        ))  # fmt: skip
        try:
            view = await asyncio.shield(enqueue)
            waiter.enqueued = True
            waiter.confirmed_at = sent
            if self._waiters.get(key) is waiter:  # not granted by a push meanwhile
                self._enqueued += 1
            self._learn(view)
            if self._waiters.get(key) is waiter:
                self._add_turn(key)
            self._has_waiters.set()
            async with asyncio.timeout_at(deadline):
                return await asyncio.shield(waiter.future)
        except TimeoutError:
            lease, position = await self._withdraw(key, waiter, enqueue, keep=True)
            if lease is not None:
                return lease
            raise BusyError(
                f"no capacity within {timeout:.1f}s",
                queue_position=position,
                retry_after_s=waiter.ticket.estimate_s or self._mean_hold_s,
            ) from None
        except StoreUnavailable as exc:  # fail closed
            self._take_waiter(key)
            waiter.future.cancel()
            self._orphans.add(key)  # the enqueue may have landed before the error
            raise self._unavailable(exc) from exc
        except BaseException:
            await self._withdraw(key, waiter, enqueue, keep=False)
            raise

    async def release(self, lease: Lease) -> None:
        if self._leases.pop(lease.lease_id, None) is None:
            if lease.released:
                lease.mark_released()  # raises: released twice
            raise MisuseError(f"lease {lease.lease_id} is not held by this coordinator")
        lease.mark_released()
        self._forget_lease(lease)
        if self._closed:
            return  # aclose already returned it to the store
        held_s = time.monotonic() - lease.granted_at
        task = self._spawn(self._release_in_store(lease.lease_id, held_s))
        try:
            view = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._learn_later)  # the slot is freed all the same
            raise
        # Learned here, not in the task: the waiter we hand the slot to is resolved
        # when release() returns, not a loop iteration before.
        if view is not None:
            self._learn(view)

    async def set_limits(self, limits: dict[str, int]) -> None:
        self._start()
        self._learn(await self._ask(asyncio.shield(self._spawn(self._backend.set_limits(limits)))))

    async def snapshot(self) -> AdmissionSnapshot:
        try:
            snap = await self._backend.snapshot()
        except StoreUnavailable as exc:
            self._set_reachable(False, exc)
            return AdmissionSnapshot(
                held={},
                queued={},
                limits=dict(self._limits),
                waiting=0,
                store=self.store,
                reachable=False,
            )
        self._set_reachable(True)
        return snap

    async def shared_secret(self) -> bytes:
        return await self._ask(self._backend.shared_secret())

    async def _ask(self, call: Awaitable[T]) -> T:
        """A store call outside admission; an unreachable store is ``BusyError``."""
        try:
            return await call
        except StoreUnavailable as exc:
            raise self._unavailable(exc) from exc

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._fence_timer is not None:
            self._fence_timer.cancel()
            self._fence_timer = None
        await cancel_and_wait(*self._tasks)
        waiting = list(self._waiters)
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(PoolClosedError("coordinator closed"))
        self._waiters.clear()
        self._enqueued = 0
        self._turns.clear()
        if self._inflight:  # let enqueues in flight land, so that they are dropped too
            await asyncio.gather(*self._inflight, return_exceptions=True)
        ids = [*self._leases, *waiting, *self._orphans]
        try:
            if ids:
                await self._backend.drop(ids)
        except StoreUnavailable as exc:
            _log.warning("could not free %d entries on close (%s); they expire by TTL",
                         len(ids), exc)
        await self._backend.close()

    # -- LocalEntries ----------------------------------------------------------------------
    def local_entries(
        self,
    ) -> tuple[list[tuple[str, tuple[str, ...]]], list[tuple[str, tuple[str, ...]]]]:
        leases = [(k, lease.resources) for k, lease in self._leases.items() if not lease.lost]
        waiters = [(k, w.resources) for k, w in self._waiters.items() if w.enqueued]
        return leases, waiters

    def entries_lost(self, ids: Iterable[str]) -> None:
        for key in ids:
            lease = self._leases.get(key)
            if lease is not None:
                lease.fence("not_restored")
            self._fail_waiter(key, "queue entry lost when the store was reset")

    # -- state machine: no await below -----------------------------------------------------
    def _learn(self, view: StoreView) -> None:
        if view.limits is not None:  # a store may tell only the limits of some resources
            self._limits.update(view.limits)
        if view.mean_hold_s is not None:
            self._mean_hold_s = view.mean_hold_s
        self._resolve(view.granted)
        if not view.positions:
            return
        limit_of = limit_lookup(self._limits)
        for key, position in view.positions.items():
            waiter = self._waiters.get(key)
            if waiter is not None:
                capacity = bottleneck_capacity(waiter.resources, limit_of)
                estimate = estimate_wait_s(position, capacity, self._mean_hold_s)
                waiter.ticket.update(position=position, estimate_s=estimate)

    def _resolve(self, ids: Iterable[str]) -> None:
        """Hand each granted waiter its lease; ids we no longer wait for are ignored."""
        for key in ids:
            waiter = self._take_waiter(key)
            if waiter is None or waiter.future.done():
                continue
            waiter.future.set_result(self._new_lease(key, waiter))

    def _take_waiter(self, key: str) -> _Waiter | None:
        waiter = self._waiters.pop(key, None)
        if waiter is not None and waiter.enqueued:
            self._enqueued -= 1
        return waiter

    def _add_turn(self, key: str) -> None:
        """A queued waiter takes its turn among those whose position is told."""
        turns = self._turns
        turns.append(key)
        if len(turns) > 2 * self._enqueued + 64:  # mostly gone: amortized O(1) per append
            self._turns = deque(k for k in turns if k in self._waiters)

    def _new_lease(self, key: str, waiter: _Waiter) -> Lease:
        """The lease a granted waiter becomes, with its local expiry watched."""
        own = self._expiry(waiter.confirmed_at)
        lease = Lease(key, waiter.resources, expires_at=own, shared=self._liveness)
        lease.retry_after_s = self._retry_after_s()
        self._leases[key] = lease
        self._live_leases += 1
        lease.on_lost(functools.partial(self._lease_lost, key))
        if own > self._liveness.expires_at:
            self._young[key] = own
            heapq.heappush(self._young_heap, (own, key))
        self._arm()
        return lease

    def _lease_lost(self, key: str, _error: BaseException) -> None:
        if key in self._leases:
            self._live_leases -= 1
            self._young.pop(key, None)

    def _forget_lease(self, lease: Lease) -> None:
        """A lease left ``_leases`` (released)."""
        if lease.lost is None:
            self._live_leases -= 1
            self._young.pop(lease.lease_id, None)

    def _expiry(self, confirmed_at: float) -> float:
        return confirmed_at + self.lease_ttl_s - self.safety_margin_s

    def _retry_after_s(self) -> float:
        return max(1.0, self.lease_ttl_s / 3)

    # -- the fence: one timer at the earliest local expiry ---------------------------------
    def _earliest(self) -> float | None:
        """The earliest local expiry of a live lease (None: none)."""
        if self._live_leases > len(self._young):  # some are covered by the liveness
            return self._liveness.expires_at
        heap = self._young_heap
        while heap and self._young.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # released or lost meanwhile
            self.keeper_work += 1
        return heap[0][0] if heap else None

    def _arm(self) -> None:
        """(Re-)arm the fence timer at the earliest local expiry, if it would fire later."""
        at = self._earliest()
        if at is not None and self._fence_at <= at:
            return  # fires early enough: it re-arms itself then
        if self._fence_timer is not None:
            self._fence_timer.cancel()
            self._fence_timer, self._fence_at = None, math.inf
        if at is not None and not self._closed:
            delay = max(0.0, at - time.monotonic())
            self._fence_timer = asyncio.get_running_loop().call_later(delay, self._fence_due)
            self._fence_at = at

    def _fence_due(self) -> None:
        """Fence every live lease whose local expiry has passed, then re-arm."""
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        self._fence_timer, self._fence_at = None, math.inf
        now = time.monotonic()
        if now >= self._liveness.expires_at and self._live_leases > len(self._young):
            # The process's renewal is overdue: every lease it covered has expired (a
            # pass over the leases, only when fencing them).
            for key, lease in list(self._leases.items()):
                self.keeper_work += 1
                if key not in self._young:
                    lease.fence("expired")
        heap = self._young_heap
        while heap and heap[0][0] <= now:  # own expiry passed, and later than the process's
            own, key = heapq.heappop(heap)
            self.keeper_work += 1
            if self._young.get(key) == own:
                del self._young[key]
                self._leases[key].fence("expired")
        self._arm()

    def _advance(self) -> None:
        """The liveness moved on: the leases whose own expiry it passed are covered."""
        heap, liveness = self._young_heap, self._liveness.expires_at
        while heap and heap[0][0] <= liveness:
            own, key = heapq.heappop(heap)
            self.keeper_work += 1
            if self._young.get(key) == own:
                del self._young[key]

    def _fail_waiter(self, key: str, message: str) -> None:
        waiter = self._waiters.get(key)
        if waiter is not None and waiter.enqueued and not waiter.future.done():
            self._take_waiter(key)
            waiter.future.set_exception(
                BusyError(
                    message,
                    queue_position=waiter.ticket.position,
                    retry_after_s=self._retry_after_s(),
                    reason=UNAVAILABLE,
                )
            )

    def _set_reachable(self, reachable: bool, exc: BaseException | None = None) -> None:
        if reachable != self._reachable:
            if reachable:
                _log.warning("admission store %s reachable again", self.store)
            else:
                _log.error("admission store %s unreachable: %s", self.store, exc)
        self._reachable = reachable

    def _unavailable(self, exc: StoreUnavailable) -> BusyError:
        self._set_reachable(False, exc)
        return BusyError(
            f"admission store unreachable: {exc}",
            queue_position=0,
            retry_after_s=self._retry_after_s(),
            reason=UNAVAILABLE,
        )

    # -- leaving the queue -----------------------------------------------------------------
    async def _withdraw(
        self, key: str, waiter: _Waiter, enqueue: asyncio.Task[StoreView], *, keep: bool
    ) -> tuple[Lease | None, int]:
        self._take_waiter(key)  # from here on, _resolve ignores this id
        if _granted(waiter.future):
            lease = waiter.future.result()
            if keep:
                return lease, 0
            await self.release(lease)
            return None, 0
        waiter.future.cancel()
        if self._closed:
            return None, 0
        task = self._spawn(self._withdraw_in_store(key, waiter, enqueue, keep=keep))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if keep:  # cancelled while timing out: a kept lease has nobody to return it
                task.add_done_callback(self._free_kept)
            raise

    async def _withdraw_in_store(
        self, key: str, waiter: _Waiter, enqueue: asyncio.Task[StoreView], *, keep: bool
    ) -> tuple[Lease | None, int]:
        with contextlib.suppress(Exception):  # its error went to the caller already
            # The withdraw must reach the store after the enqueue; the enqueue's pass may
            # have granted other waiters of ours (a store tells us our own grants only
            # in its answers).
            self._learn(await enqueue)
        try:
            out = await self._backend.withdraw(key, keep=keep)
        except StoreUnavailable as exc:
            _log.warning("could not withdraw waiter %s (%s); retrying later", key[:8], exc)
            self._orphans.add(key)
            return None, waiter.ticket.position
        self._learn(out.view)
        if out.granted and keep:
            return self._new_lease(key, waiter), 0
        return None, out.position or waiter.ticket.position

    def _free_kept(self, task: asyncio.Task[tuple[Lease | None, int]]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        lease, _ = task.result()
        if lease is not None and not lease.released:
            self._spawn(self.release(lease))

    async def _release_in_store(self, lease_id: str, held_s: float) -> StoreView | None:
        try:
            return await self._backend.release(lease_id, held_s)
        except StoreUnavailable as exc:
            _log.warning("could not release lease %s (%s); retrying, else it expires by TTL",
                         lease_id[:8], exc)
            self._orphans.add(lease_id)
            self._set_reachable(False, exc)
            return None

    def _learn_later(self, task: asyncio.Task[StoreView | None]) -> None:
        if not task.cancelled() and task.exception() is None:
            view = task.result()
            if view is not None:
                self._learn(view)

    # -- background work: one poller, one heartbeat, one push listener per process --------
    def _start(self) -> None:
        if self._closed:
            raise PoolClosedError("coordinator closed")
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._poll_loop(), name="spacepool-admission-poll"),
            loop.create_task(self._heartbeat_loop(), name="spacepool-admission-heartbeat"),
            loop.create_task(
                self._backend.watch(self._resolve, self._poll_now.set),
                name="spacepool-admission-watch",
            ),
        ]

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return task

    async def _poll_loop(self) -> None:
        interval = self._backend.poll_interval_s
        while True:
            if not self._waiters:
                self._has_waiters.clear()
                await self._has_waiters.wait()
                continue
            # Jittered, so that processes polling the same store do not fall into step
            # with each other or with the rhythm of the work.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval * random.uniform(0.5, 1.5)):
                    await self._poll_now.wait()
            self._poll_now.clear()
            await self._poll_once()

    async def _poll_once(self) -> None:
        """One poll: our grants made by others, and the positions due (bounded work)."""
        if not self._enqueued:
            return
        try:
            view = await self._backend.poll(self._told())
        except StoreUnavailable as exc:
            self._set_reachable(False, exc)
            return
        self._set_reachable(True)
        self._learn(view)

    def _told(self) -> list[str]:
        """The next queued waiters whose position is refreshed (none if not due yet)."""
        now = time.monotonic()
        if now < self._next_positions:
            return []
        self._next_positions = now + self._backend.positions_every_s
        wanted = self._backend.positions_per_poll
        told: list[str] = []
        turns, budget = self._turns, 4 * wanted  # a bounded share of gone ones dropped
        while turns and budget and len(told) < wanted:
            key = turns.popleft()
            budget -= 1
            self.keeper_work += 1
            waiter = self._waiters.get(key)
            if waiter is not None and waiter.enqueued:
                told.append(key)
        turns.extend(told)
        return told

    async def _heartbeat_loop(self) -> None:
        """The owner's renewals, at the rhythm of :class:`~._ownership.Heartbeat`."""
        rhythm = Heartbeat(self.lease_ttl_s)

        def failed(exc: Exception) -> None:
            self._set_reachable(False, exc)
            self._expire_waiters()  # again soon: the leases' local expiry is coming

        await rhythm.run(
            lambda: self._heartbeat(timeout=rhythm.period_s),
            failed=failed,
            ok=lambda: self._set_reachable(True),
            errors=(StoreUnavailable,),
        )

    async def _heartbeat(self, *, timeout: float) -> None:
        """Renew the process's liveness, then retry the orphans' withdrawals.

        A renewal is waited for until the first local expiry (at least ``timeout``):
        an answer after it comes too late for that lease, and a retry must have its
        turn. The stores' own timeouts (socket, busy) are shorter still.
        """
        self._fence_due()  # a lease past its local expiry before its timer ran
        self.keeper_work += 1
        held = self._live_leases + self._enqueued
        if held:
            sent = time.monotonic()
            first = self._earliest()
            wait_s = timeout if first is None else max(timeout, first - sent)
            try:
                async with asyncio.timeout(wait_s):
                    missing = await self._backend.renew(held, self._held_ids)
            except TimeoutError:
                raise StoreUnavailable("lease renewal timed out") from None
            self._renewed(missing, sent)
        for key in list(self._orphans):
            out = await self._backend.withdraw(key, keep=False)
            self._orphans.discard(key)
            self._learn(out.view)

    def _held_ids(self) -> list[str]:
        """Every live lease and queued waiter of ours: only for a check, when the store
        holds fewer entries than we do."""
        ids = [k for k, lease in self._leases.items() if lease.lost is None]
        ids += [k for k, w in self._waiters.items() if w.enqueued]
        self.keeper_work += len(ids)
        return ids

    def _renewed(self, missing: set[str], sent: float) -> None:
        """Fence what the store lost; push back the local expiry of everything else."""
        for key in missing:
            lease = self._leases.get(key)
            if lease is not None:
                lease.fence("missing")
            self._fail_waiter(key, "queue entry expired in the store")
        expiry = self._expiry(sent)
        if expiry > self._liveness.expires_at:
            self._liveness.expires_at = expiry
            self._renewed_at = max(self._renewed_at, sent)
            self._advance()
            self._arm()

    def _expire_waiters(self) -> None:
        """Fail the waiters whose entry may have expired in the unreachable store."""
        now = time.monotonic()
        if self._expiry(self._renewed_at) > now:
            return  # the last renewal covers every waiter for now
        for key, waiter in list(self._waiters.items()):
            confirmed = max(waiter.confirmed_at, self._renewed_at)
            if waiter.enqueued and self._expiry(confirmed) <= now:
                self._fail_waiter(key, "admission store unreachable; queue entry expired")


def _granted(future: asyncio.Future[Lease]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None
