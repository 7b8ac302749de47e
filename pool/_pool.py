"""The pool: lifecycle and composition — the one object a caller holds.

:class:`Pool` builds the layers (README, "How it is built") and wires each the narrow
things it needs; it decides nothing itself:

* ``pool/transport`` — the opener (native, falling back to gradio_client);
* ``pool/connections`` — one :class:`~pool.connections._space_pool.SpacePool` per Space;
* ``pool/routing`` — :class:`~pool.routing._choice.Choice` (which Space), the pins, apps;
* ``pool/resilience`` — the shared health board (windows, breakers) and the waker;
* ``pool/admission`` — the coordinator (slots, leases, shared values);
* on top: :class:`~pool._attempt.Attempts` (one attempt: route, wake, admit, check out,
  release), :class:`~pool._request.RequestPath` (a call over attempts: retries, the
  deadline, partials, events, files), :class:`~pool._sessions.Sessions`
  (conversations), upkeep and statistics.

:meth:`Pool.client` is one attempt; :meth:`Pool.predict` is the request path's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import httpx

from ._attempt import Attempts
from ._clock import SYSTEM_CLOCK, Clock
from ._consumer import ANONYMOUS, scope
from ._events import Hook
from ._exceptions import (
    MisuseError,
    PoolClosedError,
    UnknownSpace,
)
from ._request import CallAttempt, Prediction, PredictOptions, RequestPath
from ._sessions import PoolSession, Sessions
from ._settings import PoolSettings
from ._space_reads import SpaceReads
from ._spaces import Login, SpaceSpec, parse_spaces, with_logins
from ._stats import Shared, Stats
from ._threads import shutdown_executor
from ._trace import on_event as on_trace_event
from ._trace import span
from ._upkeep import Upkeep
from .admission import (
    CONSUMER_PREFIX,
    GLOBAL_RESOURCE,
    Coordinator,
    WaitingCoordinator,
    WaitTicket,
    new_id,
    open_coordinator,
)
from .connections import Failover, Partial, PooledClient, SpacePool
from .resilience import (
    HealthBoard,
    HealthParams,
    HubSpaceControl,
    RetryPolicy,
    SpaceControl,
    WakePolicy,
    Waker,
    resource_cap,
)
from .routing import Apps, Choice, Router, user_key
from .transport import (
    AppInfo,
    FallbackOpener,
    GradioFactory,
    NativeOpener,
    SpaceOpener,
    UpstreamEvent,
    quiet_gradio_env,
)

ClientFactory = Callable[[str], Any]
"""Opens a ``gradio_client.Client`` (or a compatible object) for a source URL or id,
blocking (run in the pool's I/O threads): the fallback transport for every Space."""

_log = logging.getLogger("spacepool")
_CLOSE_WAIT_S = 5.0  # aclose() waits this long at most for the I/O threads to end
_CONNECT_BACKOFF_S = (0.5, 4.0)  # opening a connection again: base and cap of the backoff


def _opener(
    s: PoolSettings, token: str | None, client_factory: ClientFactory | None,
    executor: ThreadPoolExecutor, logins: dict[str, Login],
) -> SpaceOpener:  # fmt: skip
    """The transport: native, falling back to gradio_client for a Space whose protocol
    it does not speak; gradio_client alone with ``POOL_TRANSPORT=gradio_client`` or a
    ``client_factory``. ``logins``: by Space source, for Spaces behind Gradio's login."""
    fallback = FallbackOpener(
        client_factory or GradioFactory(
            token=token, connect_timeout_s=s.connect_timeout_s,
            read_timeout_s=s.read_timeout_s, max_workers=s.client_max_workers,
            logins=logins,
        ),
        executor,
    )  # fmt: skip
    if client_factory is not None or s.transport != "native":
        return fallback
    return NativeOpener(
        token=token, connect_timeout_s=s.connect_timeout_s, read_timeout_s=s.read_timeout_s,
        min_size=s.min_connections, max_size=s.max_connections, fallback=fallback,
        executor=executor, logins=logins,
    )  # fmt: skip


class Pool:
    """Warm connections to several Spaces behind one admission."""

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
        specs = spaces if spaces is not None else parse_spaces(s.space_entries())
        self._specs = with_logins(specs, s.space_logins())
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
        logins = {spec.src: spec.login for spec in self._specs if spec.login is not None}
        self._opener = _opener(s, token, client_factory, self._executor, logins)
        self._control: SpaceControl = space_control or HubSpaceControl(
            token, executor=self._executor, clock=self.clock
        )
        self.retry_policy = RetryPolicy(s.retry_attempts, s.retry_backoff_s, s.retry_backoff_max_s)
        self.resource_cap = resource_cap()
        self._board: HealthBoard | None = None
        self._waker: Waker | None = None
        self.router = Router(ttl_s=s.assignment_ttl_s, clock=self.clock.now)  # pins: at start
        self.spaces = self._space_pools()
        self.hooks: list[Hook] = []
        self._stats = Stats(
            self.spaces, s, self.router, self.clock, new_id(), self.resource_cap.cap
        )
        self.hooks.append(self._stats.on_event)
        self.hooks.append(on_trace_event)  # admission waits, retries, failovers in traces
        self._upkeep = Upkeep(self.spaces, s, self.hooks, self.clock, self._stats.publish)
        self._secret: bytes = b""
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._closed = False
        self._http: httpx.AsyncClient | None = None
        self._api_info: dict[str, tuple[object, dict[str, Any]]] = {}  # name → (app_id, info)
        self._reads = SpaceReads(self.spaces)

    @functools.cached_property
    def sessions(self) -> Sessions:
        """Conversations: one Space, one upstream session each (pool/_sessions.py)."""
        return Sessions(
            values=lambda: self.coordinator.values, spaces=self.spaces, clock=self.clock,
            idle_s=self.settings.session_idle_s, hash_user=self.hash_user,
        )  # fmt: skip

    @functools.cached_property
    def attempts(self) -> Attempts:
        """One attempt's route, wake, admission, checkout and release (pool/_attempt.py)."""
        assert self._http is not None, "started"
        return Attempts(
            settings=self.settings, spaces=self.spaces, choice=self.choice, apps=self.apps,
            router=self.router, waker=self.waker, board=self.board,
            coordinator=WaitingCoordinator(self.coordinator, self._stats.live_waits),
            sessions=self.sessions, hooks=self.hooks,
            clock=self.clock, http=self._http, hash_user=self.hash_user,
            failover=self.failover,
        )  # fmt: skip

    @functools.cached_property
    def failover(self) -> Failover:
        """The one failure path (pool/connections/_failover.py)."""
        return Failover(self.spaces, self.board, self.hooks, self.clock)

    @functools.cached_property
    def requests(self) -> RequestPath:
        """Retries, deadline, partials, events, files: a call over attempts."""
        return RequestPath(self.attempts.lease, self.settings, self.retry_policy, self.hooks,
                           self.clock)  # fmt: skip

    @functools.cached_property
    def choice(self) -> Choice:
        """Which Space serves each attempt (pool/routing/_choice.py)."""
        return Choice(spaces=self.spaces, board=self.board, apps=self.apps,
                      router=self.router, hooks=self.hooks, clock=self.clock)  # fmt: skip

    @functools.cached_property
    def apps(self) -> Apps:
        """The Spaces' apps and replicas; routing's ambiguity check (pool/routing/_apps.py)."""
        return Apps(
            self.spaces, self.settings.connect_timeout_s, self.failover, self.waker.stage,
        )

    def _space_pools(self) -> dict[str, SpacePool]:
        s = self.settings
        reopen = RetryPolicy(s.connect_attempts, *_CONNECT_BACKOFF_S)
        return {
            spec.name: SpacePool(
                spec,
                min_size=s.min_connections,
                max_size=s.max_connections,
                opener=self._opener,
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
            self._coordinator = open_coordinator(
                s.coordinator_url, lease_ttl_s=s.lease_ttl_s, ca_file=s.coordinator_ca_file,
                allow_evicting_store=s.allow_evicting_store, clock=self.clock.now,
            )  # fmt: skip
        coordinator = self._coordinator
        self.router.use(coordinator.values)
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
        attempts: Attempts | None = self.__dict__.get("attempts")  # made once started
        for handle in list(attempts.handles if attempts else ()):
            # Jobs still running are cancelled upstream before their connections are
            # cut (the close waits for the cancels): a Space does not drop a running
            # job when its stream goes, and the slot being released must be free there.
            handle._cancel_jobs(closing=True)
        for sp in self.spaces.values():
            sp.close_nowait()
        self._opener.cut_opening()  # clients under construction fail now, not at timeout
        await asyncio.gather(*(sp.aclose() for sp in self.spaces.values()))
        if attempts is not None and attempts.detached:  # releases on their way to the store
            with contextlib.suppress(TimeoutError):
                async with self.clock.timeout(_CLOSE_WAIT_S):
                    await asyncio.wait(attempts.detached)
        with contextlib.suppress(Exception):
            await self._stats.withdraw()
        await self._opener.aclose()  # the Spaces' HTTP clients
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
        return user_key(self._secret, email, scope())  # within its consumer (an API key)

    def sign(self, message: str) -> str:
        """An HMAC-SHA256 (hex) of ``message`` under the fleet's shared secret, the key of
        :meth:`hash_user`: a token any process of the fleet can check (the Gradio
        front's login cookie)."""
        if not self._secret:
            raise MisuseError("sign() needs a started pool (await pool.start())")
        return hmac.new(self._secret, message.encode(), hashlib.sha256).hexdigest()

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
        async with self.attempts.lease(
            email, space, queue_timeout_s, ticket, avoid, wake_limit_s, api_name, session
        ) as handle:
            yield handle

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
        (:class:`pool._request.PredictOptions` says what each argument does)."""
        options = PredictOptions(
            email=email, space=space, kwargs=kwargs or {}, timeout=timeout,
            queue_timeout_s=queue_timeout_s, safe_to_retry=safe_to_retry, ticket=ticket,
            on_admitted=on_admitted, download_to=download_to, on_partial=on_partial,
            headers=headers, on_event=on_event, session=session, priority=priority,
        )  # fmt: skip
        await self.start()
        with span("spacepool.predict", api_name=api_name, space=space):  # pool/_trace.py
            return await self.requests.predict(api_name, args, options)

    async def call(
        self,
        api_name: str | None,
        *,
        email: str | None = None,
        space: str | None = None,
        timeout: float | None = None,
        queue_timeout_s: float | None = None,
        safe_to_retry: bool = False,
        ticket: WaitTicket | None = None,
        session: str | PoolSession | None = None,
        priority: str | None = None,
    ) -> AsyncIterator[CallAttempt]:
        """The attempts of one call whose work the caller runs itself (the Gradio
        front's relayed events), under the rules of :meth:`predict`: its waiting,
        refusals, retries, deadline and cancellation are the pool's::

            async for attempt in pool.call("/predict", email=email):
                with attempt:                     # what it raises is judged here
                    async with attempt.lease() as handle:
                        ...                       # the work, on an admitted connection
                    break                         # done

        After an attempt that raised: a refusal for want of room waits in the pool's
        queue again until the queue timeout; a failure the retry policy repeats is
        repeated (preferably elsewhere) after its backoff; anything else is raised from
        the loop. The arguments are :meth:`predict`'s."""
        options = PredictOptions(
            email=email, space=space, timeout=timeout, queue_timeout_s=queue_timeout_s,
            safe_to_retry=safe_to_retry, ticket=ticket, session=session, priority=priority,
        )  # fmt: skip
        await self.start()
        async for attempt in self.requests.calls(api_name, options):
            yield attempt

    async def open_session(
        self, email: str | None, space: str | None = None, *, limit: int | None = None,
        api_name: str | None = None,
    ) -> PoolSession:  # fmt: skip
        """A conversation: calls with ``session=`` share one Space and its ``gr.State``
        (:mod:`pool._sessions`); it expires after ``POOL_SESSION_IDLE_S`` without a call.
        Without ``space`` it is unpinned (``space == ""``) until its first call, which
        is routed by its ``api_name`` like any call and pins it; ``api_name`` binds it to
        the app that has that endpoint (:class:`~pool.UnknownEndpoint` or
        :class:`~pool.AmbiguousEndpoint` as for a call). ``limit``: the sessions one user
        may hold open (anonymous callers: one user); :class:`~pool.UserLimitReached` at
        it."""
        await self.start()
        app = None if space is not None or api_name is None else await self.choice.app_for(api_name)
        return await self.sessions.open(email, space, limit=limit, app=app)

    async def get_session(self, session: str | PoolSession, email: str | None) -> PoolSession:
        """The live session (:class:`~pool.SessionNotFound` if unknown, expired or not
        ``email``'s)."""
        await self.start()
        return await self.sessions.get(session, email)

    async def close_session(self, session: str | PoolSession, email: str | None) -> None:
        """End the session (:class:`~pool.SessionNotFound` as :meth:`get_session`)."""
        await self.start()
        await self.sessions.close(session, email)

    async def endpoints(self, space: str) -> dict[str, Any]:
        """The Space's API as ``Client.view_api(return_format="dict")`` gives it, plus
        ``app_id``; cached per Space until its ``app_id`` changes (a restart).

        Read from a live pooled connection (no network: its client read it when the
        connection opened); if the Space has none yet, one is opened. Takes no
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
            info = conn.client.view_api()
            app_id = conn.app_id
        finally:
            if leased is not None:
                sp.checkin(leased, discard=False)
        described = {"space": space, "app_id": app_id, **info}
        self._api_info[space] = (app_id, described)
        return described

    # -- what a Space serves without admission (pool/_space_reads.py) ---------------------
    async def space_app(self, space: str) -> AppInfo:
        """The Space's app as last read (config, endpoints, ``app_id``; re-read when it
        restarts). No slot is taken: it runs nothing on the Space."""
        await self.start()
        return await self._reads.app(space)

    async def space_info(self, space: str, params: Mapping[str, str]) -> tuple[int, Any]:
        """The Space's ``gradio_api/info`` with ``params``: its status and JSON body."""
        await self.start()
        return await self._reads.info(space, params)

    @contextlib.asynccontextmanager
    async def space_file(self, space: str, path: str) -> AsyncIterator[httpx.Response | None]:
        """The Space's file ``path`` (its ``file=`` route), open for streaming while the
        context lasts; None when the Space does not serve it."""
        await self.start()
        async with self._reads.file(space, path) as response:
            yield response

    @contextlib.asynccontextmanager
    async def space_web(self, space: str, path: str) -> AsyncIterator[httpx.Response]:
        """The Space's own web page (``path`` ``""``) or a file it loads (``path`` under
        its address), open for streaming while the context lasts, whatever its status
        (the Gradio front's pages)."""
        await self.start()
        async with self._reads.web(space, path) as response:
            yield response

    async def space_login(self, space: str, username: str, password: str) -> bool:
        """Whether the Space's own Gradio login accepts these credentials (its token
        handed back at once)."""
        await self.start()
        return await self._reads.login(space, username, password)

    async def space_cadence(self, space: str) -> float | None:
        """The Space's heartbeat interval in seconds as measured on its streams; None
        while not known (then measured in the background)."""
        await self.start()
        return await self._reads.cadence(space)

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
        stats = await self._stats.collect(
            self._upkeep.health_running, self._upkeep.last_health_check
        )
        due = self._upkeep.next_health_check  # the dashboard's "next at …" before the first
        stats["nextHealthCheck"] = due.isoformat().replace("+00:00", "Z") if due else None
        return stats
