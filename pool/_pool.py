"""The pool: Spaces, admission, routing, health — and ``get_client`` on top.

One request goes through these steps, each owned by one object, each bounded by the
request's deadline (``timeout=``) when it has one:

1. route — :class:`~pool._routing.Router` orders the candidate Spaces, among those up
   whose shared circuit breaker admits work (:mod:`pool.resilience`); after a
   breaker's cool-down one request is its half-open probe;
2. wake — a Space with no live connection that the Hub reports asleep is woken and
   waited for within its wake deadline (no slot is held meanwhile);
3. admit — the coordinator grants ``backend:global`` + ``space:<name>`` (whose limit
   is the Space's adaptive window) + ``consumer:<hash>`` (``consumer:anonymous`` for
   every caller without an email) all at once, FIFO, within the queue deadline;
4. check out — the Space's :class:`~pool._space_pool.SpacePool` hands over an
   exclusive connection, opening one if needed (lazy start, growth to the max);
5. release — on every exit path one shielded task detaches the handle, returns (or
   discards) the connection, releases the lease and feeds the outcome (success,
   provider failure, neutral) to the shared window and breaker. A second cancel
   cannot cut it short; the caller waits for it until its deadline at most.

Every failure goes through one path (:meth:`Pool._space_failed`), which reads the
one table of failure kinds (:mod:`pool._failures`): a failure before the call is
placed marks the Space down for a cool-down and the request moves on to the next
candidate (SPEC 4.4). :meth:`Pool.predict` is :class:`~pool._request.RequestPath`'s:
the retry policy, the deadline, partials, events and files over such attempts.

The layers, bottom up: ``pool/transport/`` (the Gradio wire protocol, no admission),
``_native.py`` / ``_legacy.py`` (a connection's client on either transport),
``_connection.py`` and ``_space_pool.py`` (connections of one Space),
``_handle.py`` (a leased connection), this module (routing, admission, lifecycle),
``_request.py`` (a call over attempts).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

import httpx

from ._apps import Apps
from ._clock import SYSTEM_CLOCK, Clock
from ._connection import ClientFactory, Connection, gradio_factory, quiet_gradio_env
from ._events import Hook, PoolEvent, emit
from ._exceptions import (
    BusyError,
    DeadlineExceeded,
    LeaseLost,
    MisuseError,
    NoHealthySpaceError,
    PoolClosedError,
    PoolError,
    RefusedByPolicy,
    UnknownEndpoint,
    UnknownSpace,
    UpstreamTransportError,
)
from ._failures import failure
from ._handle import Partial, PooledClient
from ._native import NativeFactory
from ._request import Prediction, RequestPath
from ._routing import ANONYMOUS, Router, user_key
from ._scheduling import classed_ticket, queue_timeout_for
from ._sessions import PoolSession, Sessions
from ._settings import PoolSettings
from ._space_pool import SpacePool
from ._spaces import SpaceSpec, parse_spaces
from ._stats import Shared, Stats
from ._threads import shutdown_executor
from ._upkeep import Upkeep
from .admission import (
    CONSUMER_PREFIX,
    GLOBAL_RESOURCE,
    SPACE_PREFIX,
    Coordinator,
    Lease,
    WaitTicket,
    open_coordinator,
)
from .admission._protocol import new_id
from .resilience import (
    HealthBoard,
    HealthParams,
    HubSpaceControl,
    Outcome,
    RetryPolicy,
    SpaceControl,
    WakePolicy,
    Waker,
    http_probe,
    resource_cap,
)
from .transport import UpstreamEvent

_log = logging.getLogger("spacepool")
_T = TypeVar("_T")
_SPACE_COOLDOWN_S = 30.0
_CLOSE_WAIT_S = 5.0  # aclose() waits this long at most for the I/O threads to end
_RELEASE_GRACE_S = 0.25  # a caller past its deadline still waits this long for release
_CONNECT_BACKOFF_S = (0.5, 4.0)  # opening a connection again: base and cap of the backoff


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


class Pool:
    """Warm gradio_client connections for several Spaces behind one admission."""

    def __init__(
        self,
        settings: PoolSettings | None = None,
        *,
        spaces: list[SpaceSpec] | None = None,
        client_factory: ClientFactory | None = None,
        coordinator: Coordinator | None = None,
        space_control: SpaceControl | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = s = settings or PoolSettings()
        self._specs = spaces if spaces is not None else parse_spaces(s.space_entries())
        if not self._specs:
            raise ValueError("no Spaces configured: set POOL_SPACES")
        token = s.hf_token.get_secret_value() if s.hf_token else None
        self._coordinator = coordinator
        self._owns_coordinator = coordinator is None
        self.clock = clock or SYSTEM_CLOCK
        # Blocking work (the fallback's open, close, cancel; Hub API calls) runs here,
        # never on the loop nor in its default executor: our own executor (threads
        # start on first use), so that aclose() can end its threads.
        self._executor = ThreadPoolExecutor(16, thread_name_prefix="spacepool-io")
        fallback = gradio_factory(
            token=token,
            connect_timeout_s=s.connect_timeout_s,
            read_timeout_s=s.read_timeout_s,
            max_workers=s.client_max_workers,
        )
        self._factory: ClientFactory = client_factory or fallback
        if client_factory is None and s.transport == "native":
            self._factory = NativeFactory(
                token=token, connect_timeout_s=s.connect_timeout_s,
                read_timeout_s=s.read_timeout_s, min_size=s.min_connections,
                max_size=s.max_connections, fallback=fallback, executor=self._executor,
            )  # fmt: skip
        self._control: SpaceControl = space_control or HubSpaceControl(
            token, executor=self._executor, clock=self.clock
        )
        self.retry_policy = RetryPolicy(s.retry_attempts, s.retry_backoff_s, s.retry_backoff_max_s)
        self.resource_cap = resource_cap()
        self._board: HealthBoard | None = None
        self._waker: Waker | None = None
        self.router = Router(ttl_s=s.assignment_ttl_s, clock=self.clock.now)
        self.spaces = self._space_pools()
        self.hooks: list[Hook] = []
        self._stats = Stats(
            self.spaces, s, self.router, self.clock, new_id(), self.resource_cap.cap
        )
        self.hooks.append(self._stats.on_event)
        self._upkeep = Upkeep(self.spaces, s, self.hooks, self.clock, self._stats.publish)
        self._secret: bytes = b""
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._closed = False
        self._http: httpx.AsyncClient | None = None
        self._handles: set[PooledClient] = set()  # leased now (aclose cancels their jobs)
        self._detached: set[asyncio.Task[Any]] = set()  # releases that outlive their await
        self._api_info: dict[str, tuple[object, dict[str, Any]]] = {}  # name → (app_id, info)
        # Retries, deadline, partials, events, files: the call over admitted attempts.
        self.requests = RequestPath(self.client, s, self.retry_policy, self.hooks, self.clock)

    @functools.cached_property
    def sessions(self) -> Sessions:
        """Conversations: one Space, one upstream session each (pool/_sessions.py)."""
        return Sessions(self)

    @functools.cached_property
    def apps(self) -> Apps:
        """The Spaces' apps and replicas; routing's ambiguity check (pool/_apps.py)."""
        return Apps(
            self.spaces, self.settings.connect_timeout_s, self._space_failed, self.waker.stage
        )

    def _space_pools(self) -> dict[str, SpacePool]:
        s = self.settings
        reopen = RetryPolicy(s.connect_attempts, *_CONNECT_BACKOFF_S)
        return {
            spec.name: SpacePool(
                spec,
                min_size=s.min_connections,
                max_size=s.max_connections,
                factory=self._factory,
                executor=self._executor,
                reopen=reopen,
                clock=self.clock,
            )
            for spec in self._specs
        }

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Idempotent: opens the coordinator and starts maintenance; no connections."""
        if self._started:
            return
        if self._closed:
            raise PoolClosedError("pool closed")
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if not self._started:
                await self._start()

    async def _start(self) -> None:
        quiet_gradio_env()
        s = self.settings
        if self._coordinator is None:
            self._coordinator = open_coordinator(s.coordinator_url, lease_ttl_s=s.lease_ttl_s)
        coordinator = self._coordinator
        await coordinator.set_limits({
            GLOBAL_RESOURCE: s.global_max_concurrent,
            CONSUMER_PREFIX: s.consumer_max_concurrent,
            CONSUMER_PREFIX + ANONYMOUS: s.anonymous_limit,  # every anonymous caller: one
        })  # fmt: skip
        ceiling = min(s.max_connections, self.resource_cap.cap, s.window_max)
        params = HealthParams(
            initial=s.window_initial,
            ceiling=ceiling,
            grow_after=s.window_grow_after,
            breaker_failures=s.breaker_failures,
            cooldown_s=s.breaker_cooldown_s,
            probe_timeout_s=max(s.breaker_cooldown_s, s.read_timeout_s),
        )
        self._board = HealthBoard(coordinator, list(self.spaces), params, self.hooks,
                                  clock=self.clock)  # fmt: skip
        await self._board.start()  # every Space's limit is its shared window
        policy = WakePolicy(
            deadline_s=s.wake_timeout_s,
            poll_s=s.wake_poll_s,
            idle_pause_s=s.idle_pause_s,
            min_uptime_s=s.min_uptime_s,
            pause_spaces=s.pause_names(),
        )
        self._waker = Waker(self._control, self._board, policy, self.hooks, clock=self.clock)
        self._secret = (
            s.user_hash_key.get_secret_value().encode()
            if s.user_hash_key
            else await coordinator.shared_secret()
        )
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(5.0))
        self._stats.shared = Shared(coordinator, self._board, self._waker)
        self._upkeep.start(self._stats.shared, self._http)
        self._started = True
        with contextlib.suppress(Exception):  # appear in fleet stats at once
            await self._stats.publish()

    @property
    def coordinator(self) -> Coordinator:
        if self._coordinator is None:
            raise PoolClosedError("pool not started")
        return self._coordinator

    @property
    def board(self) -> HealthBoard:
        """The fleet's shared health records (window, breaker, wake) of every Space."""
        if self._board is None:
            raise PoolClosedError("pool not started")
        return self._board

    @property
    def waker(self) -> Waker:
        if self._waker is None:
            raise PoolClosedError("pool not started")
        return self._waker

    async def aclose(self) -> None:
        """Close every connection, release every lease, stop background work.

        Returns once the threads and sockets the pool opened are gone: gradio_client's
        (heartbeat, executors, result-stream reader), the ``spacepool-io`` threads, the
        store's connections and worker thread, the health checker's HTTP client.
        """
        if self._closed:
            return
        self._closed = True
        await self._upkeep.aclose()
        for handle in list(self._handles):
            # Jobs still running are cancelled upstream before their connections are
            # cut (the close waits for the cancels): a Space does not drop a running
            # job when its stream goes, and the slot being released must be free there.
            handle._cancel_jobs(closing=True)
        for sp in self.spaces.values():
            sp.close_nowait()
        cut_opening = getattr(self._factory, "cut_opening", None)
        if cut_opening is not None:  # Clients under construction fail now, not at timeout
            cut_opening()
        await asyncio.gather(*(sp.aclose() for sp in self.spaces.values()))
        if self._detached:  # releases still on their way to the store
            with contextlib.suppress(TimeoutError):
                async with self.clock.timeout(_CLOSE_WAIT_S):
                    await asyncio.wait(self._detached)
        with contextlib.suppress(Exception):
            await self._stats.withdraw()
        if isinstance(self._factory, NativeFactory):  # the Spaces' HTTP clients
            await self._factory.aclose()
        if self._http is not None:
            await self._http.aclose()
        if self._coordinator is not None and self._owns_coordinator:
            await self._coordinator.aclose()
        left = await shutdown_executor(self._executor, _CLOSE_WAIT_S)
        if left:
            _log.warning("pool closed with %d I/O thread(s) still running", len(left))

    # -- the request path -----------------------------------------------------------------
    def hash_user(self, email: str | None) -> str | None:
        """The keyed hash that represents ``email`` (None for anonymous)."""
        if email is None or not email.strip():
            return None
        if not self._secret:
            raise MisuseError("hash_user() needs a started pool (await pool.start())")
        return user_key(self._secret, email)

    @contextlib.asynccontextmanager
    async def client(
        self,
        email: str | None = None,
        *,
        space: str | None = None,
        queue_timeout_s: float | None = None,
        ticket: WaitTicket | None = None,
        avoid: Sequence[str] = (),
        wake_limit_s: float | None = None,
        api_name: str | None = None,
        session: str | PoolSession | None = None,
    ) -> AsyncIterator[PooledClient]:
        """Admission, then an exclusive connection; everything released on exit.

        One attempt on one Space: ``predict`` on the handle is not retried (use
        :meth:`predict` for retries and failover). ``avoid`` names Spaces to route
        around when another one can serve (a retry after a failure there);
        ``wake_limit_s`` is the request's deadline: it bounds every step (routing, a
        wait for a sleeping Space, admission, the checkout with connecting, and the
        wait for the release at the end) by :class:`DeadlineExceeded`. ``api_name``:
        the endpoint the caller will call; without ``space``, only Spaces that have it
        (or whose API is not known yet) are candidates, and when no Space has it
        :class:`UnknownEndpoint` is raised before any slot is taken. ``session``: one
        from :meth:`open_session` (its Space, its upstream state; :mod:`pool._sessions`).
        """
        await self.start()
        record = None if session is None else await self.sessions.resolve(session, email, space)
        space = space if record is None else record.space
        if space is not None and space not in self.spaces:
            raise UnknownSpace(space, list(self.spaces))
        user = self.hash_user(email)
        now = self.clock.now()
        ticket = classed_ticket(self.settings, ticket, None)
        queue_by = now + queue_timeout_for(self.settings, ticket, queue_timeout_s)
        by = None if wake_limit_s is None else now + wake_limit_s
        lease, sp, conn = await self._admit_and_checkout(
            user, space, queue_by, by, ticket, avoid, api_name
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
            await self._await_detached(release, by)

    def _handle_for(self, sp: SpacePool, conn: Connection, lease: Lease) -> PooledClient:
        s = self.settings
        handle = PooledClient(
            conn,
            sp.name,
            lambda c: self._space_failed(sp, c.error, placed=True),
            self._executor,
            guard=s.secret_guard == "on" or (s.secret_guard == "auto" and sp.spec.is_hub),
            lease=lease,
            http=self._http,
            file_max_bytes=s.file_max_bytes,
            stream_keep=s.stream_keep,
            clock=self.clock,
        )
        lease.on_lost(functools.partial(self._lease_lost, sp.name, handle))
        self._handles.add(handle)
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
        self._handles.discard(handle)
        if (seen := handle.upstream_queue()) is not None:
            sp.saw_queue(*seen, self.clock.wall())
        sp.checkin(conn, discard=handle._detach())
        if lease.lost is None:
            await self.coordinator.release(lease)  # a store outage: the store retries it
        else:  # the store is likely out of reach: answer the caller now (issue 22)
            _detach(self._detached, self.coordinator.release(lease))
        emit(self.hooks, PoolEvent("finished", sp.name, outcome, held_s))
        await self._record(sp.name, handle.outcome)

    async def _await_detached(
        self, work: Coroutine[Any, Any, _T], by: float | None = None
    ) -> _T | None:
        """Run ``work`` in a task of its own that a cancel of ours does not stop; wait for
        it until ``by`` (at least ``_RELEASE_GRACE_S``); past that it goes on alone
        (and ``aclose`` waits for it). None if it was left running."""
        task = asyncio.get_running_loop().create_task(work)
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)
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

    async def predict(
        self,
        api_name: str | None,
        *args: Any,
        email: str | None = None,
        space: str | None = None,
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
        queue_timeout_s: float | None = None,
        safe_to_retry: bool = False,
        ticket: WaitTicket | None = None,
        on_admitted: Callable[[str], Awaitable[None]] | None = None,
        download_to: str | os.PathLike[str] | None = None,
        on_partial: Callable[[Partial], Awaitable[None]] | None = None,
        headers: Mapping[str, str] | None = None,
        on_event: Callable[[UpstreamEvent], Awaitable[None]] | None = None,
        session: str | PoolSession | None = None,
        priority: str | None = None,
    ) -> Prediction:
        """One predict with retries, failover, one deadline, partials, events and files
        (:meth:`pool._request.RequestPath.predict` says what each argument does)."""
        return await self.requests.predict(
            api_name, *args, email=email, space=space, kwargs=kwargs, timeout=timeout,
            queue_timeout_s=queue_timeout_s, safe_to_retry=safe_to_retry, ticket=ticket,
            on_admitted=on_admitted, download_to=download_to, on_partial=on_partial,
            headers=headers, on_event=on_event, session=session, priority=priority,
        )  # fmt: skip

    async def open_session(
        self, email: str | None, space: str | None = None, *, limit: int | None = None
    ) -> PoolSession:
        """A conversation: calls with ``session=`` share one Space and its ``gr.State``
        (:mod:`pool._sessions`); it expires after ``POOL_SESSION_IDLE_S`` without a call.
        ``limit``: the sessions one user may hold open (anonymous callers: one user);
        :class:`~pool.UserLimitReached` at it."""
        return await self.sessions.open(email, space, limit=limit)

    async def _admit_and_checkout(
        self,
        user: str | None,
        space: str | None,
        queue_by: float,
        by: float | None,
        ticket: WaitTicket | None,
        avoid: Sequence[str],
        api_name: str | None,
    ) -> tuple[Lease, SpacePool, Connection]:
        """Route, wake, admit, check out; a failure before the call fails over."""
        tried: list[str] = []
        last_error: PoolError | None = None
        while True:
            name, probing = await self._within(
                by, "routing", self._pick(user, space, tried, last_error, avoid, api_name)
            )
            sp = self.spaces[name]
            try:
                lease, conn = await self._admit_one(sp, user, queue_by, by, ticket)
            except UpstreamTransportError as exc:
                self._space_failed(sp, exc, placed=False)
                if failure(exc.kind).provider:
                    await self._await_detached(self._record(name, "failure"))
                elif probing:
                    await self._await_detached(self._record(name, "neutral"))
                tried.append(name)
                last_error = exc
                continue
            except BaseException:
                if probing:  # hand the half-open probe back: nothing was learned
                    await self._await_detached(self._record(name, "neutral"))
                raise
            if space is None and not sp.may_serve(api_name):
                # Its API became known on connecting, without the endpoint: not here.
                sp.checkin(conn, discard=False)
                await self._await_detached(self.coordinator.release(lease))
                if probing:
                    await self._await_detached(self._record(name, "neutral"))
                tried.append(name)
                continue
            if user is not None and space is None:
                self.router.repin(self.apps.pin_key(user, api_name) or user, name)
            return lease, sp, conn

    async def _admit_one(
        self,
        sp: SpacePool,
        user: str | None,
        queue_by: float,
        by: float | None,
        ticket: WaitTicket | None,
    ) -> tuple[Lease, Connection]:
        """Wake ``sp`` if it sleeps, admit, check out; UpstreamTransportError: fail over."""
        await self.waker.ensure_awake(
            sp.spec,
            connected=sp.total > 0 and sp.is_up(),
            probe=functools.partial(self._answers, sp),
            ticket=ticket,
            give_up_at=by,
        )
        # Anonymous callers share one consumer (issue 28): however many they are, they
        # hold at most POOL_ANONYMOUS_MAX_CONCURRENT slots, and a named user's request is
        # never queued behind theirs (a waiter held back by its consumer holds no place).
        consumer = CONSUMER_PREFIX + (user or ANONYMOUS)
        resources = [GLOBAL_RESOURCE, SPACE_PREFIX + sp.name, consumer]
        waited_from = self.clock.now()
        limit = queue_by if by is None else min(queue_by, by)
        try:
            lease = await self.coordinator.acquire(
                resources, timeout=max(0.0, limit - waited_from), ticket=ticket
            )
        except BusyError as exc:
            emit(self.hooks, PoolEvent("busy", sp.name, exc.reason))
            raise
        emit(self.hooks, PoolEvent("admitted", sp.name, None, self.clock.now() - waited_from))
        try:
            # A cold Space whose /config hangs must not hold the slots past the
            # deadline; the connection being opened carries on and serves the next one.
            conn = await self._within(by, f"connecting to Space {sp.name!r}", sp.checkout())
        except BaseException:  # an UpstreamTransportError (could not connect) fails over
            await self._await_detached(self.coordinator.release(lease))
            raise
        return lease, conn

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

    def _space_failed(self, sp: SpacePool, error: PoolError, *, placed: bool) -> bool:
        """The one failure path (:mod:`pool._failures`): count a provider failure; route
        around ``sp`` for a cool-down when the failure came before the call was placed
        (``placed`` False) or says the Space is unreachable, unless it is booting.
        True when a failover was counted (once per failure)."""
        row = failure(error.kind)
        if row.provider:
            emit(self.hooks, PoolEvent("provider_error", sp.name, error.kind))
        waking = self.board.get(sp.name).waking(self.clock.wall())
        # A 429's Retry-After is honoured (a user's QuotaExceeded says nothing of the Space)
        asked = error.retry_after_s if isinstance(error, UpstreamTransportError) else None
        if placed and (not (row.down or asked) or waking):
            return False
        if not waking:
            sp.mark_down(error.kind, asked or _SPACE_COOLDOWN_S)
        emit(self.hooks, PoolEvent("failover", sp.name, error.kind))
        _log.warning("space %s failed (%s); failing over", sp.name, error.kind)
        return True

    async def _answers(self, sp: SpacePool) -> bool:
        """Whether a booting Space serves now: its app_id route, or the Hub's stage."""
        async with self.clock.timeout(None):  # real I/O, bounded by httpx / the Hub call
            if sp.probe_url is not None and self._http is not None:
                return await http_probe(self._http, sp.probe_url)
            return await self.waker.stage(sp.spec, fresh=True) == "RUNNING"

    async def _pick(
        self,
        user: str | None,
        space: str | None,
        tried: list[str],
        last: PoolError | None,
        avoid: Sequence[str],
        api_name: str | None = None,
    ) -> tuple[str, bool]:
        """The Space for this attempt — up, breaker closed or ours to probe, not tried,
        with the endpoint — and whether this request is its half-open probe."""
        if space is not None:
            return await self._pick_named(space, tried, last)
        board = self.board
        # AmbiguousEndpoint, before any slot (Spaces the pool paused are not woken for it)
        await self.apps.check(api_name, lambda n: board.get(n).admits() and not board.get(n).paused)
        self._check_endpoint(api_name)
        user = self.apps.pin_key(user, api_name)  # a pin per app
        while True:
            now = self.clock.wall()
            usable = [
                n
                for n, sp in self.spaces.items()
                if sp.is_up()
                and n not in tried
                and sp.may_serve(api_name)
                and (board.get(n).admits() or board.get(n).probe_due(now))
            ]
            if not usable:
                detail = f"; last failure: {last.kind}" if last else ""
                raise NoHealthySpaceError(
                    f"every Space failed, is unhealthy or has its breaker open{detail}",
                    retry_after_s=self._retry_after_down(),
                )
            # Prefer Spaces that are awake and not just failed for this request; a Space
            # the pool paused itself only when nothing else can serve.
            preferred = [n for n in usable if not board.get(n).paused and n not in avoid]
            candidates = (
                preferred or [n for n in usable if not board.get(n).paused] or usable
            )
            pinned = self.router.pinned(user) if user else None
            if pinned is not None and pinned not in usable and not board.get(pinned).admits():
                emit(self.hooks, PoolEvent("failover", pinned, "breaker_open"))
            probes = [n for n in candidates if not board.get(n).admits()]
            if probes and not (pinned in candidates and board.get(pinned or "").admits()):
                if await board.take_probe(probes[0]):
                    return probes[0], True  # recovery needs a probe: this request is it
                tried.append(probes[0])
                continue
            closed = [n for n in candidates if board.get(n).admits()]
            choice = self.router.candidates(user, closed, lambda n: self.spaces[n].load())[0]
            if user is not None and pinned != choice:
                emit(self.hooks, PoolEvent("assignment", choice))
            return choice, False

    async def _pick_named(
        self, space: str, tried: list[str], last: PoolError | None
    ) -> tuple[str, bool]:
        """A request for one Space: it, or its half-open probe, else NoHealthySpaceError."""
        if tried:
            raise NoHealthySpaceError(
                f"Space {space!r} failed ({last.kind if last else '?'})",
                retry_after_s=self._retry_after_down(),
            )
        health = self.board.get(space)
        if health.admits():
            return space, False
        if await self.board.take_probe(space):
            return space, True
        emit(self.hooks, PoolEvent("failover", space, "breaker_open"))
        raise NoHealthySpaceError(
            f"Space {space!r} is refusing work for now (circuit breaker open)",
            retry_after_s=max(1.0, health.retry_after(self.clock.wall())),
        )

    def _check_endpoint(self, api_name: str | None) -> None:
        """UnknownEndpoint if every Space's API is known and none has ``api_name``."""
        if any(sp.may_serve(api_name) for sp in self.spaces.values()):
            return
        known = sorted(set().union(*(sp.api_names or () for sp in self.spaces.values())))
        raise UnknownEndpoint(str(api_name), known, where="the pool's Spaces have")

    def _retry_after_down(self) -> float:
        """Seconds until the first Space marked down or breaker-open may be tried again."""
        now, wall = self.clock.now(), self.clock.wall()
        waits = [sp.down_until - now for sp in self.spaces.values() if sp.down_until > now]
        waits += [
            w for n in self.spaces if (w := self.board.get(n).retry_after(wall)) > 0
        ]
        return round(max(1.0, min(waits)), 1) if waits else 1.0

    async def _record(self, name: str, outcome: Outcome) -> None:
        """Feed the shared window and breaker; a store outage never fails the request."""
        h = self.board.get(name)
        if h.breaker == "closed" and (
            outcome == "neutral"  # nothing to learn, no probe to hand back
            or (  # at the ceiling with nothing to reset: a success changes nothing we use
                outcome == "success"
                and h.window >= h.ceiling
                and h.failures == 0
                and not self.waker.policy.pauses(name)
            )
        ):
            return
        try:
            await self.board.record(name, outcome)
        except (PoolError, OSError) as exc:
            _log.warning("space %s: could not record %s (%s)", name, outcome, exc)

    async def endpoints(self, space: str) -> dict[str, Any]:
        """The Space's API as ``Client.view_api(return_format="dict")`` gives it, plus
        ``app_id``; cached per Space until its ``app_id`` changes (a restart).

        Read from a live pooled connection (no network: gradio_client fetched it when
        the connection opened); if the Space has none yet, one is opened. Takes no
        admission slot: it runs nothing on the Space.
        """
        await self.start()
        sp = self.spaces.get(space)
        if sp is None:
            raise UnknownSpace(space, list(self.spaces))
        cached = self._api_info.get(space)
        if cached is not None and sp.app_id is not None and cached[0] == sp.app_id:
            return cached[1]
        conn = sp.current_connection()
        leased = None
        if conn is None:
            leased = conn = await sp.checkout()
        try:
            info = conn.client.view_api(return_format="dict", print_info=False)
            app_id = conn.app_id
        finally:
            if leased is not None:
                sp.checkin(leased, discard=False)
        described = {"space": space, "app_id": app_id, **info}
        self._api_info[space] = (app_id, described)
        return described

    # -- maintenance and statistics (pool/_upkeep.py, pool/_stats.py) -----------------------
    async def health_check(self) -> None:
        """One round: probe ≤ ``health_sample`` idle connections per Space (SPEC 4.4)."""
        await self.start()
        assert self._stats.shared is not None and self._http is not None
        await self._upkeep.health_check(self._stats.shared, self._http)

    @property
    def last_health_check(self) -> datetime | None:
        """When this process's last health round ended (UTC)."""
        return self._upkeep.last_health_check

    async def stats(self) -> dict[str, Any]:
        """The pool-stats dict (SPEC 5) for the whole fleet sharing the coordinator.

        Connection counts are summed over every process that published a snapshot in
        the last few seconds; queue and in-flight figures come from the store itself.
        ``up``/``lastError``/``generation`` are this process's view.
        """
        return await self._stats.collect(
            self._upkeep.health_running, self._upkeep.last_health_check
        )
