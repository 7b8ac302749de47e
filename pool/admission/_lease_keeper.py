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
  expired entries, so no external janitor is needed.
* **One heartbeat per process** renews every local lease and waiter entry each
  ``lease_ttl/3``, and retries a failed renewal every ``min(lease_ttl/9, 0.5 s)``: the
  rhythm of every owner in the fleet (:mod:`pool.admission._ownership`, which durable
  jobs follow too). The store decides what a renewal costs: Redis renews one liveness
  deadline for the whole process, whatever it holds (its entries are only counted);
  SQLite renews each entry.
  A SIGKILLed process stops renewing; anybody's next pass reclaims its slots and
  queue entries after ``lease_ttl``.
* **Self-fencing.** Each lease knows its *local expiry*: the send time of the last
  store call that confirmed it (enqueue or renewal: the store's deadline was set
  after it) + ``lease_ttl`` − a safety margin (:data:`SAFETY_FRACTION` of the TTL,
  for the clocks' rates and for the time a cancel takes to reach the Space). So the
  local expiry always comes strictly before the store's. A timer per lease (not the
  heartbeat task) fences the lease when that moment passes unrenewed, and so does a
  renewal that finds it missing in the store: :meth:`Lease.fence` runs the holder's
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
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from .._exceptions import BusyError, MisuseError, PoolClosedError
from .._tasks import cancel_and_wait
from ._ownership import Heartbeat
from ._protocol import AdmissionSnapshot, Lease, StoreUnavailable, WaitTicket, new_id
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

    async def poll(self, waiting: Sequence[str]) -> StoreView:
        """Which of ``waiting`` are leases now; reclaims expired entries when due."""
        ...

    async def renew(self, ids: Sequence[str]) -> set[str]:
        """Push back the expiry of these leases/waiters; returns the ids not found."""
        ...

    async def drop(self, ids: Sequence[str]) -> None:
        """Free these leases and delete these waiters in one operation (close)."""
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
        # Send time of the last store call that confirmed the entry (enqueue, renew):
        # its deadline in the store, and that of the lease it becomes, is later than
        # this + lease_ttl.
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
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._backend = backend
        self._waiters: dict[str, _Waiter] = {}
        self._leases: dict[str, Lease] = {}
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
            self._learn(view)
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
            self._waiters.pop(key, None)
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
        timer = self._timers.pop(lease.lease_id, None)
        if timer is not None:
            timer.cancel()
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
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        await cancel_and_wait(*self._tasks)
        waiting = list(self._waiters)
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(PoolClosedError("coordinator closed"))
        self._waiters.clear()
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
            waiter = self._waiters.pop(key, None)
            if waiter is None or waiter.future.done():
                continue
            waiter.future.set_result(self._new_lease(key, waiter))

    def _new_lease(self, key: str, waiter: _Waiter) -> Lease:
        """The lease a granted waiter becomes, with its local expiry watched."""
        lease = Lease(key, waiter.resources, expires_at=self._expiry(waiter.confirmed_at))
        lease.retry_after_s = self._retry_after_s()
        self._leases[key] = lease
        self._watch(lease)
        return lease

    def _expiry(self, confirmed_at: float) -> float:
        return confirmed_at + self.lease_ttl_s - self.safety_margin_s

    def _retry_after_s(self) -> float:
        return max(1.0, self.lease_ttl_s / 3)

    def _watch(self, lease: Lease) -> None:
        """(Re-)arm the timer that fences ``lease`` at its local expiry."""
        delay = max(0.0, lease.expires_at - time.monotonic())
        self._timers[lease.lease_id] = asyncio.get_running_loop().call_later(
            delay, self._expire, lease
        )

    def _expire(self, lease: Lease) -> None:
        if lease.released or lease.lost is not None:
            self._timers.pop(lease.lease_id, None)
        elif time.monotonic() >= lease.expires_at:
            self._timers.pop(lease.lease_id, None)
            lease.fence("expired")
        else:  # renewed meanwhile
            self._watch(lease)

    def _fail_waiter(self, key: str, message: str) -> None:
        waiter = self._waiters.get(key)
        if waiter is not None and waiter.enqueued and not waiter.future.done():
            del self._waiters[key]
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
        self._waiters.pop(key, None)  # from here on, _resolve ignores this id
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
            await enqueue  # the withdraw must reach the store after the enqueue
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
            waiting = [k for k, w in self._waiters.items() if w.enqueued]
            if not waiting:
                continue
            try:
                view = await self._backend.poll(waiting)
            except StoreUnavailable as exc:
                self._set_reachable(False, exc)
                continue
            self._set_reachable(True)
            self._learn(view)

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
        """Renew every live lease and waiter, then retry the orphans' withdrawals.

        A renewal is waited for until the first local expiry (at least ``timeout``):
        an answer after it comes too late for that lease, and a retry must have its
        turn. The stores' own timeouts (socket, busy) are shorter still.
        """
        now = time.monotonic()
        for lease in list(self._leases.values()):
            if lease.lost is None and lease.expires_at <= now:  # before its timer ran
                lease.fence("expired")
        leases = [k for k, lease in self._leases.items() if lease.lost is None]
        ids = [*leases, *(k for k, w in self._waiters.items() if w.enqueued)]
        if ids:
            sent = time.monotonic()
            first = min((self._leases[k].expires_at for k in leases), default=sent + timeout)
            try:
                async with asyncio.timeout(max(timeout, first - sent)):
                    missing = await self._backend.renew(ids)
            except TimeoutError:
                raise StoreUnavailable("lease renewal timed out") from None
            self._renewed(ids, missing, sent)
        for key in list(self._orphans):
            out = await self._backend.withdraw(key, keep=False)
            self._orphans.discard(key)
            self._learn(out.view)

    def _renewed(self, ids: Iterable[str], missing: set[str], sent: float) -> None:
        """Push back the local expiry of what was renewed; fence what the store lost."""
        expiry = self._expiry(sent)
        for key in ids:
            lease = self._leases.get(key)
            waiter = self._waiters.get(key)
            if key in missing:
                if lease is not None:
                    lease.fence("missing")
                self._fail_waiter(key, "queue entry expired in the store")
            elif lease is not None and lease.lost is None:
                lease.expires_at = max(lease.expires_at, expiry)
            elif waiter is not None:
                waiter.confirmed_at = max(waiter.confirmed_at, sent)

    def _expire_waiters(self) -> None:
        """Fail the waiters whose entry may have expired in the unreachable store."""
        now = time.monotonic()
        for key, waiter in list(self._waiters.items()):
            if waiter.enqueued and self._expiry(waiter.confirmed_at) <= now:
                self._fail_waiter(key, "admission store unreachable; queue entry expired")


def _granted(future: asyncio.Future[Lease]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None
