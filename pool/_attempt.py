"""One attempt: route, wake, admit, check out, run, release — the steps under
:meth:`Pool.client <pool.Pool.client>`, each bounded by the request's deadline.

1. route — :class:`~pool.routing._choice.Choice` picks the Space (its pin, the breaker's
   half-open probe, least loaded);
2. wake — a Space with no live connection that the Hub reports asleep is woken and
   waited for within its wake deadline (no slot is held meanwhile);
3. admit — the coordinator grants ``backend:global`` + ``space:<name>`` (whose limit
   is the Space's adaptive window) + ``consumer:<hash>`` (``consumer:anonymous`` for
   every caller without an email) all at once, FIFO, within the queue deadline;
4. check out — the Space's :class:`~pool.connections._space_pool.SpacePool` hands over
   an exclusive connection, opening one if needed;
5. release — on every exit path one shielded task detaches the handle, returns (or
   discards) the connection, releases the lease and feeds the outcome (success,
   provider failure, neutral) to the shared window and breaker. A second cancel
   cannot cut it short; the caller waits for it until its deadline at most.

Every failure goes through one path (:meth:`Failover.space_failed
<pool.connections.Failover.space_failed>`, a layer below), which reads the one table of
failure kinds (:mod:`pool._failures`): a failure before the call is placed marks the
Space down for a cool-down and the request moves on to the next candidate (SPEC 4.4).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from ._clock import Clock
from ._consumer import admission_consumers
from ._events import Hook, PoolEvent, emit
from ._exceptions import (
    BusyError,
    DeadlineExceeded,
    LeaseLost,
    PoolError,
    RefusedByPolicy,
    UnknownSpace,
    UpstreamTransportError,
)
from ._failures import failure
from ._first_of import FirstOf, Repinned
from ._sessions import PoolSession, Sessions
from ._settings import PoolSettings
from ._trace import traced
from .admission import (
    GLOBAL_RESOURCE,
    SPACE_PREFIX,
    Coordinator,
    Lease,
    WaitTicket,
)
from .connections import Connection, Failover, PooledClient, SpacePool
from .resilience import HealthBoard, Outcome, Waker
from .routing import Apps, Choice, Route, Router, classed_ticket, queue_timeout_for

_log = logging.getLogger("spacepool")
_T = TypeVar("_T")
_RELEASE_GRACE_S = 0.25  # a caller past its deadline still waits this long for release


def _log_failure(task: asyncio.Task[Any]) -> None:
    """Report the error of a release task that nobody awaits any more."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        _log.error("a release failed after its caller left: %r", exc)


def _detach(tasks: set[asyncio.Task[Any]], work: Coroutine[Any, Any, Any]) -> None:
    """Run ``work`` alone, kept in ``tasks`` (which ``aclose`` waits for)."""
    task = asyncio.get_running_loop().create_task(work)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    task.add_done_callback(_log_failure)


class Attempts:
    """One attempt's steps, each owned by one object (see the module docstring)."""

    def __init__(
        self, *, settings: PoolSettings, spaces: Mapping[str, SpacePool], choice: Choice,
        apps: Apps, router: Router, waker: Waker, board: HealthBoard,
        coordinator: Coordinator, sessions: Sessions, hooks: list[Hook], clock: Clock,
        http: httpx.AsyncClient, hash_user: Callable[[str | None], str | None],
        failover: Failover,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.spaces = spaces
        self.choice = choice
        self.apps = apps
        self.router = router
        self.waker = waker
        self.board = board
        self.coordinator = coordinator
        self.sessions = sessions
        self.hooks = hooks
        self.clock = clock
        self._http = http
        self.hash_user = hash_user
        self.failover = failover
        self.handles: set[PooledClient] = set()  # leased now (aclose cancels their jobs)
        self.detached: set[asyncio.Task[Any]] = set()  # releases that outlive their await

    @contextlib.asynccontextmanager
    async def lease(
        self, email: str | None, space: str | None, queue_timeout_s: float | None,
        ticket: WaitTicket | None, avoid: Sequence[str], wake_limit_s: float | None,
        api_name: str | None, session: str | PoolSession | None,
    ) -> AsyncIterator[PooledClient]:  # fmt: skip
        """:meth:`Pool.client <pool.Pool.client>` (which says what each argument does),
        once the pool is started."""
        record = None if session is None else await self.sessions.resolve(session, email, space)
        space = space if record is None else record.space or space  # unpinned: routed
        if record is not None and api_name is not None:
            self.choice.check_session_call(record.space, record.app, api_name)
        unpinned = record is not None and record.space is None
        app = record.app if record is not None and unpinned else None
        if space is not None and space not in self.spaces:
            raise UnknownSpace(space, list(self.spaces))
        user = self.hash_user(email)
        # An anonymous session's calls share a pin of their own until the first pins it:
        # two first calls at once wait for one replica, as a named user's do.
        pin_as = None
        if record is not None and unpinned and user is None:
            pin_as = f"session/{record.key}"
        now = self.clock.now()
        ticket = classed_ticket(self.settings, ticket, None)
        queue_by = now + queue_timeout_for(self.settings, ticket, queue_timeout_s)
        by = None if wake_limit_s is None else now + wake_limit_s
        lease, sp, conn = await self._admit_and_checkout(
            user, space, queue_by, by, ticket, avoid, api_name, app, pin_as
        )
        handle = self._handle_for(sp, conn, lease)
        started = self.clock.now()
        outcome = "ok"
        try:
            if record is not None:
                await self.sessions.attach(sp, conn, record)
            yield handle
        except PoolError as exc:
            outcome = exc.kind
            if isinstance(exc, RefusedByPolicy):
                emit(self.hooks, PoolEvent("policy", sp.name, exc.reason))
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except BaseException:
            outcome = "caller_error"
            raise
        finally:
            release = self._release(sp, conn, lease, handle, outcome, self.clock.now() - started)
            await self.await_detached(release, by)

    def _handle_for(self, sp: SpacePool, conn: Connection, lease: Lease) -> PooledClient:
        s = self.settings
        handle = PooledClient(
            conn,
            sp.name,
            functools.partial(self.failover.job_failed, sp),
            guard=s.secret_guard == "on" or (s.secret_guard == "auto" and sp.spec.is_hub),
            lease=lease,
            http=self._http,
            file_max_bytes=s.file_max_bytes,
            stream_keep=s.stream_keep,
            clock=self.clock,
            pacer=sp.pacer,
        )
        lease.on_lost(functools.partial(self._lease_lost, sp.name, handle))
        self.handles.add(handle)
        return handle

    async def _release(
        self,
        sp: SpacePool,
        conn: Connection,
        lease: Lease,
        handle: PooledClient,
        outcome: str,
        held_s: float,
    ) -> None:
        """Every step of a release, in one task (so no second cancel skips one)."""
        self.handles.discard(handle)
        if (seen := handle.upstream_queue()) is not None:
            sp.saw_queue(*seen, self.clock.wall())
        sp.checkin(conn, discard=handle._detach())
        if lease.lost is None:
            await self.coordinator.release(lease)  # a store outage: the store retries it
        else:  # the store is likely out of reach: answer the caller now (issue 22)
            _detach(self.detached, self.coordinator.release(lease))
        emit(self.hooks, PoolEvent("finished", sp.name, outcome, held_s))
        await self.record(sp.name, handle.outcome, handle.at)

    async def await_detached(
        self, work: Coroutine[Any, Any, _T], by: float | None = None
    ) -> _T | None:
        """Run ``work`` in a task of its own that a cancel of ours does not stop; wait for
        it until ``by`` (at least ``_RELEASE_GRACE_S``); past that it goes on alone
        (and ``aclose`` waits for it). None if it was left running."""
        task = asyncio.get_running_loop().create_task(work)
        self.detached.add(task)
        task.add_done_callback(self.detached.discard)
        wait = None if by is None else max(by - self.clock.now(), _RELEASE_GRACE_S)
        try:
            async with self.clock.timeout(wait):
                return await asyncio.shield(task)
        except TimeoutError:
            task.add_done_callback(_log_failure)  # it goes on alone
            return None
        except asyncio.CancelledError:
            task.add_done_callback(_log_failure)
            raise

    async def _admit_and_checkout(
        self,
        user: str | None,
        space: str | None,
        queue_by: float,
        by: float | None,
        ticket: WaitTicket | None,
        avoid: Sequence[str],
        api_name: str | None,
        app: str | None = None,
        pin_as: str | None = None,
    ) -> tuple[Lease, SpacePool, Connection]:
        """Route, wake, admit, check out; a failure before the call fails over."""
        tried: list[str] = []
        last_error: PoolError | None = None
        while True:
            route = await self._within(
                by, "routing",
                self.choice.pick(user, space, tried, last_error, avoid, api_name, app, pin_as),
            )  # fmt: skip
            sps = self._late(route.spaces)
            sp = sps[0]
            try:
                await self._wake(sp, by, ticket)
                lease, sp = await self._admit(sps, user, route, queue_by, by, ticket)
                conn = await self._checkout(sp, lease, by)
            except Repinned:
                continue  # the user's pin is a Space this waiter did not queue for
            except UpstreamTransportError as exc:
                self.failover.space_failed(sp, exc, placed=False)
                if failure(exc.kind).provider:
                    await self.await_detached(self.record(sp.name, "failure"))
                elif route.probe:
                    await self.await_detached(self.record(sp.name, "neutral"))
                tried.append(sp.name)
                last_error = exc
                continue
            except BaseException:
                if route.probe:  # hand the half-open probe back: nothing was learned
                    await self.await_detached(self.record(sp.name, "neutral"))
                raise
            if space is None and not sp.may_serve(api_name):
                # Its API became known on connecting, without the endpoint: not here.
                sp.checkin(conn, discard=False)
                await self.await_detached(self.coordinator.release(lease))
                if route.probe:
                    await self.await_detached(self.record(sp.name, "neutral"))
                tried.append(sp.name)
                continue
            return lease, sp, conn

    def _late(self, names: list[str]) -> list[SpacePool]:
        """The Spaces a waiter queues for at once: the first routing chose, and the
        other replicas that need no waking (connected, not booting, not paused): a
        sleeping Space is woken only for a request routed to it first (a call naming its
        endpoint connects to every replica first: pool/routing/_apps.py ``discover``)."""
        now = self.board.now()
        first, *rest = (self.spaces[n] for n in names)
        return [first, *(sp for sp in rest if sp.total > 0 and sp.is_up()
                         and not self.board.get(sp.name).waking(now)
                         and not self.board.get(sp.name).paused)]  # fmt: skip

    async def _wake(self, sp: SpacePool, by: float | None, ticket: WaitTicket | None) -> None:
        """Wake ``sp`` if it sleeps; UpstreamTransportError: fail over."""
        await self.waker.ensure_awake(
            sp.spec,
            connected=sp.total > 0 and sp.is_up(),
            probe_url=sp.probe_url,
            http=self._http,
            ticket=ticket,
            give_up_at=by,
        )

    async def _admit(
        self,
        sps: list[SpacePool],
        user: str | None,
        route: Route,
        queue_by: float,
        by: float | None,
        ticket: WaitTicket | None,
    ) -> tuple[Lease, SpacePool]:
        """A lease on one of ``sps`` (best first): ``backend:global`` + its
        ``space:<name>`` + the caller's consumer, FIFO with classes, within the queue
        deadline.

        With several Spaces (late binding, issue 31) the waiter queues for each at once,
        with the same class and arrival, so the app's replicas serve one queue: the first
        replica to free a slot admission allows serves it, and every other place is given
        up (a grant that came at the same moment goes back to the store, which hands it
        to the next waiter). Grants made in one hand-off go to the best Space first.

        A user not pinned yet is pinned by its first admitted call (issue 37,
        :meth:`Choice.claim`): once any call of theirs — here or in another process —
        is admitted somewhere, their other waiters keep only their place on that Space
        (same arrival: nobody passes them), and a grant elsewhere goes back."""
        # Anonymous callers share one consumer per key (issues 28, 38): however many
        # they are, they hold at most POOL_ANONYMOUS_MAX_CONCURRENT slots (per key), and
        # a named user's request is never queued behind theirs (a waiter held back by
        # its consumer holds no place).
        # A keyed caller's users are the key's own, within its limit (pool/_consumer.py)
        consumers = admission_consumers(user)
        waited_from = self.clock.now()
        limit = queue_by if by is None else min(queue_by, by)
        timeout = max(0.0, limit - waited_from)
        claims = route.pin_key is not None and sps[0].name != route.pinned
        try:
            if len(sps) == 1 and not claims:
                sp = sps[0]
                lease = await self.coordinator.acquire(
                    [GLOBAL_RESOURCE, SPACE_PREFIX + sp.name, *consumers], timeout=timeout,
                    ticket=ticket,
                )  # fmt: skip
            else:
                first_of = FirstOf(
                    coordinator=self.coordinator, choice=self.choice, detached=self.await_detached,
                    sps=sps, consumers=consumers, route=route if claims else None,
                )  # fmt: skip
                lease, sp = await first_of.run(timeout, ticket)
        except BusyError as exc:
            emit(self.hooks, PoolEvent("busy", sps[0].name, exc.reason))
            raise
        emit(self.hooks, PoolEvent("admitted", sp.name, None, self.clock.now() - waited_from))
        return lease, sp

    async def _checkout(self, sp: SpacePool, lease: Lease, by: float | None) -> Connection:
        """A connection of ``sp`` under ``lease`` (released on failure)."""
        try:
            # A cold Space whose /config hangs must not hold the slots past the
            # deadline; the connection being opened carries on and serves the next one.
            checkout = traced("spacepool.checkout", sp.checkout(), space=sp.name)
            return await self._within(by, f"connecting to Space {sp.name!r}", checkout)
        except BaseException:  # an UpstreamTransportError (could not connect) fails over
            await self.await_detached(self.coordinator.release(lease))
            raise

    async def _within(self, by: float | None, what: str, step: Awaitable[_T]) -> _T:
        """``step`` within the request's deadline ``by``: :class:`DeadlineExceeded`.

        Without a deadline it still runs inside ``clock.timeout(None)`` (no bound): a
        step may wait on real I/O (connecting), and a virtual clock must know that."""
        if by is None:
            async with self.clock.timeout(None):
                return await step
        try:
            async with self.clock.timeout(by - self.clock.now()):
                return await step
        except TimeoutError:
            raise DeadlineExceeded(f"the deadline passed while {what}") from None

    def _lease_lost(self, space: str, handle: PooledClient, error: LeaseLost) -> None:
        """Self-fencing: the lease of a running request is lost; stop its work now."""
        handle._fence(error)
        emit(self.hooks, PoolEvent("lease_lost", space, error.why))

    async def record(self, name: str, outcome: Outcome, at: int = 0) -> None:
        """Feed the shared window and breaker (``at``: our calls at the Space when the
        call was sent); a store outage never fails the request."""
        h = self.board.get(name)
        if h.breaker == "closed" and (
            outcome == "neutral"  # nothing to learn, no probe to hand back
            or (  # at the ceiling with nothing to reset: a success changes nothing we use
                outcome in ("success", "prompt")
                and h.window >= h.ceiling
                and h.failures == 0
                and (outcome == "success" or at <= h.floor)
                and not self.waker.policy.pauses(name)
            )
        ):
            return
        try:
            await self.board.record(name, outcome, at)
        except (PoolError, OSError) as exc:
            _log.warning("space %s: could not record %s (%s)", name, outcome, exc)
