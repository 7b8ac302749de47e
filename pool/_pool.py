"""The pool: Spaces, admission, routing, health — and ``get_client`` on top.

One request goes through four steps, each owned by one object:

1. route — :class:`~pool._routing.Router` orders the candidate Spaces;
2. admit — the coordinator grants ``backend:global`` + ``space:<name>`` +
   ``consumer:<hash>`` all at once, FIFO, within the queue deadline;
3. check out — the Space's :class:`~pool._space_pool.SpacePool` hands over an
   exclusive connection, opening one if needed (lazy start, growth to the max);
4. release — on every exit path the handle is detached, the connection returned
   (or discarded) and the lease released, shielded from cancellation.

A failure to connect marks the Space down for a cool-down and the request moves on
to the next candidate (SPEC 4.4) with what is left of its queue deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from ._connection import ClientFactory, gradio_factory, quiet_gradio_env
from ._errors import Classified
from ._events import Hook, PoolEvent, emit
from ._exceptions import (
    BusyError,
    DeadlineExceeded,
    MisuseError,
    NoHealthySpaceError,
    PoolClosedError,
    PoolError,
    RefusedByPolicy,
    UnknownSpace,
    UpstreamTransportError,
)
from ._handle import PooledClient
from ._routing import Router, user_key
from ._settings import PoolSettings
from ._space_pool import SpacePool
from ._spaces import SpaceSpec, parse_spaces
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

_log = logging.getLogger("spacepool")
# Failures that mean the Space itself is unreachable: route around it.
_SPACE_DOWN_KINDS = frozenset(
    {"connect", "dropped", "invalid_state", "not_found", "timeout", "wake_timeout", "paused",
     "space_error"}
)  # fmt: skip
_SPACE_COOLDOWN_S = 30.0
_PUBLISH_S = 2.0
_PROCESS_PREFIX = "proc:"
# Per-Space figures that add up across processes in pool-stats.
_SUMMED = (
    "totalConnections",
    "availableConnections",
    "inUseConnections",
    "openingConnections",
    "healthyConnections",
    "unhealthyConnections",
    "localWaiters",
)


@dataclass(frozen=True)
class Prediction:
    """What :meth:`Pool.predict` returns."""

    space: str
    result: Any
    queued_ms: float
    duration_ms: float
    attempts: int


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
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings or PoolSettings()
        s = self.settings
        self._specs = spaces if spaces is not None else parse_spaces(s.space_entries())
        if not self._specs:
            raise ValueError("no Spaces configured: set POOL_SPACES")
        token = s.hf_token.get_secret_value() if s.hf_token else None
        self._factory = client_factory or gradio_factory(
            token=token,
            connect_timeout_s=s.connect_timeout_s,
            read_timeout_s=s.read_timeout_s,
            max_workers=s.client_max_workers,
        )
        self._coordinator = coordinator
        self._owns_coordinator = coordinator is None
        self._clock = clock
        self._wall = wall
        self._control: SpaceControl = space_control or HubSpaceControl(token)
        self.retry_policy = RetryPolicy(s.retry_attempts, s.retry_backoff_s, s.retry_backoff_max_s)
        self.resource_cap = resource_cap()
        ceiling = min(s.max_connections, self.resource_cap.cap, s.window_max)
        self._health_params = HealthParams(
            initial=s.window_initial,
            ceiling=ceiling,
            grow_after=s.window_grow_after,
            breaker_failures=s.breaker_failures,
            cooldown_s=s.breaker_cooldown_s,
            probe_timeout_s=max(s.breaker_cooldown_s, s.read_timeout_s),
        )
        self._board: HealthBoard | None = None
        self._waker: Waker | None = None
        self.router = Router(ttl_s=s.assignment_ttl_s, clock=clock)
        # Blocking gradio_client work (open, close, cancel) runs here, never on the
        # loop; our own executor (threads start on first use) so that aclose() can
        # shut its threads down.
        self._executor = ThreadPoolExecutor(16, thread_name_prefix="spacepool-io")
        self.spaces: dict[str, SpacePool] = {
            spec.name: SpacePool(
                spec,
                min_size=s.min_connections,
                max_size=s.max_connections,
                factory=self._factory,
                executor=self._executor,
                connect_attempts=s.connect_attempts,
                clock=clock,
            )
            for spec in self._specs
        }
        self.hooks: list[Hook] = []
        self._secret: bytes = b""
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._closed = False
        self._maintenance: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None
        self._waits: deque[float] = deque(maxlen=4096)
        self.health_running = False
        self.last_health_check: datetime | None = None
        self._last_health_at = 0.0
        self._process_id = new_id()

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
            if self._started:
                return
            quiet_gradio_env()
            s = self.settings
            if self._coordinator is None:
                self._coordinator = open_coordinator(
                    s.coordinator_url, lease_ttl_s=s.lease_ttl_s
                )
            await self._coordinator.set_limits(
                {
                    GLOBAL_RESOURCE: s.global_max_concurrent,
                    CONSUMER_PREFIX: s.consumer_max_concurrent,
                }
            )
            self._board = HealthBoard(
                self._coordinator,
                dict.fromkeys(self.spaces, self._health_params),
                self.hooks,
                wall=self._wall,
            )
            await self._board.start()  # every Space's limit is its shared window
            policy = WakePolicy(
                deadline_s=s.wake_timeout_s,
                poll_s=s.wake_poll_s,
                idle_pause_s=s.idle_pause_s,
                min_uptime_s=s.min_uptime_s,
                pause_spaces=s.pause_names(),
            )
            self._waker = Waker(self._control, self._board, policy, self.hooks, clock=self._clock)
            self._secret = (
                s.user_hash_key.get_secret_value().encode()
                if s.user_hash_key
                else await self._coordinator.shared_secret()
            )
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(5.0))
            self._last_health_at = self._clock()
            self._maintenance = asyncio.get_running_loop().create_task(self._maintain())
            self._started = True
            with contextlib.suppress(Exception):  # appear in fleet stats at once
                await self._publish()

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
        """Close every connection, release every lease, stop background work."""
        if self._closed:
            return
        self._closed = True
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
        await asyncio.gather(*(sp.aclose() for sp in self.spaces.values()))
        if self._started:
            with contextlib.suppress(Exception):
                await self.coordinator.delete_value(_PROCESS_PREFIX + self._process_id)
        if self._http is not None:
            await self._http.aclose()
        if self._coordinator is not None and self._owns_coordinator:
            await self._coordinator.aclose()
        self._executor.shutdown(wait=False, cancel_futures=True)

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
    ) -> AsyncIterator[PooledClient]:
        """Admission, then an exclusive connection; everything released on exit.

        One attempt on one Space: ``predict`` on the handle is not retried (use
        :meth:`predict` for retries and failover). ``avoid`` names Spaces to route
        around when another one can serve (a retry after a failure there).
        """
        await self.start()
        if space is not None and space not in self.spaces:
            raise UnknownSpace(space, list(self.spaces))
        user = self.hash_user(email)
        timeout = self.settings.queue_timeout_s if queue_timeout_s is None else queue_timeout_s
        deadline = self._clock() + timeout
        lease, sp, conn = await self._admit_and_checkout(user, space, deadline, ticket, avoid)
        started = self._clock()
        outcome = "ok"
        guard = self.settings.secret_guard == "on" or (
            self.settings.secret_guard == "auto" and sp.spec.is_hub
        )
        handle = PooledClient(
            conn, sp.name, lambda c: self._on_failure(sp, c), self._executor, guard=guard
        )
        try:
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
            discard = handle._detach()
            sp.checkin(conn, discard=discard)
            await self._release(lease)
            emit(self.hooks, PoolEvent("finished", sp.name, outcome, self._clock() - started))
            await self._record(sp.name, handle.outcome)

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
    ) -> Prediction:
        """One predict with the pool's retry policy, failover and deadline.

        A provider failure is retried (bounded, jittered backoff, preferably on another
        Space) when the Space never accepted the call, or when ``safe_to_retry`` says
        repeating it is harmless. ``timeout`` bounds the whole call, queueing and
        retries included: on expiry the upstream job is cancelled and
        :class:`DeadlineExceeded` raised. ``on_admitted(space)`` runs once a slot is held.
        """
        started = self._clock()
        deadline = None if timeout is None else started + timeout
        queue_timeout = (
            self.settings.queue_timeout_s if queue_timeout_s is None else queue_timeout_s
        )
        failed: list[str] = []
        attempt = 0
        while True:
            attempt += 1
            remaining = None if deadline is None else deadline - self._clock()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded("the deadline passed before the Space could be called")
            served: str | None = None
            try:
                async with self.client(
                    email,
                    space=space,
                    queue_timeout_s=queue_timeout if remaining is None
                    else min(queue_timeout, remaining),
                    ticket=ticket,
                    avoid=failed,
                ) as handle:
                    served = handle.space
                    admitted = self._clock()
                    if on_admitted is not None:
                        await on_admitted(served)
                    left = None if deadline is None else deadline - self._clock()
                    if left is not None and left <= 0:
                        raise DeadlineExceeded("the deadline passed while queued")
                    result = await handle.predict(
                        *args, api_name=api_name, timeout=left, **(kwargs or {})
                    )
                    return Prediction(
                        space=served,
                        result=result,
                        queued_ms=round((admitted - started) * 1000, 1),
                        duration_ms=round((self._clock() - admitted) * 1000, 1),
                        attempts=attempt,
                    )
            except UpstreamTransportError as exc:
                if not self.retry_policy.should_retry(exc, attempt, safe_to_retry=safe_to_retry):
                    raise
                delay = self.retry_policy.delay(attempt)
                if deadline is not None and self._clock() + delay >= deadline:
                    raise
                if served is not None:
                    failed.append(served)
                emit(self.hooks, PoolEvent("retry", served, exc.kind))
                _log.info("retrying after %s on %s (attempt %d)", exc.kind, served, attempt)
                await asyncio.sleep(delay)

    async def _admit_and_checkout(
        self,
        user: str | None,
        space: str | None,
        deadline: float,
        ticket: WaitTicket | None,
        avoid: Sequence[str],
    ) -> tuple[Lease, SpacePool, Any]:
        tried: list[str] = []
        last_error: PoolError | None = None
        while True:
            name = await self._pick(user, space, tried, last_error, avoid)
            sp = self.spaces[name]
            try:
                await self.waker.ensure_awake(
                    sp.spec,
                    connected=sp.total > 0 and sp.is_up(),
                    probe=functools.partial(self._answers, sp),
                    ticket=ticket,
                )
            except UpstreamTransportError as exc:
                self._space_failed(sp, exc, count=False)
                tried.append(name)
                last_error = exc
                continue
            resources = [GLOBAL_RESOURCE, SPACE_PREFIX + name]
            if user is not None:
                resources.append(CONSUMER_PREFIX + user)
            waited_from = self._clock()
            try:
                lease = await self.coordinator.acquire(
                    resources, timeout=max(0.0, deadline - self._clock()), ticket=ticket
                )
            except BusyError as exc:
                emit(self.hooks, PoolEvent("busy", name, exc.reason))
                raise
            waited = self._clock() - waited_from
            self._waits.append(waited)
            emit(self.hooks, PoolEvent("admitted", name, None, waited))
            try:
                conn = await sp.checkout()
            except PoolError as exc:
                await self._release(lease)
                if exc.kind not in _SPACE_DOWN_KINDS and not isinstance(
                    exc, UpstreamTransportError
                ):
                    raise
                self._space_failed(sp, exc, count=True)
                await self._record(name, "failure")
                tried.append(name)
                last_error = exc
                continue
            except BaseException:
                await self._release(lease)
                raise
            if user is not None and space is None:
                self.router.repin(user, name)
            return lease, sp, conn

    def _space_failed(self, sp: SpacePool, exc: PoolError, *, count: bool) -> None:
        """Route around ``sp`` for a cool-down (unless it is booting) and say so."""
        if not self.board.get(sp.name).waking(self._wall()):
            sp.mark_down(exc.kind, _SPACE_COOLDOWN_S)
        if count:
            emit(self.hooks, PoolEvent("provider_error", sp.name, exc.kind))
        emit(self.hooks, PoolEvent("failover", sp.name, exc.kind))
        _log.warning("space %s failed (%s); failing over", sp.name, exc.kind)

    async def _answers(self, sp: SpacePool) -> bool:
        """Whether a booting Space serves now: its app_id route, or the Hub's stage."""
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
    ) -> str:
        """The Space for this attempt: up, breaker closed (or ours to probe), not tried."""
        board = self.board
        if space is not None:
            if tried:
                raise NoHealthySpaceError(
                    f"Space {space!r} failed ({last.kind if last else '?'})",
                    retry_after_s=self._retry_after_down(),
                )
            health = board.get(space)
            if health.admits() or await board.take_probe(space):
                return space
            emit(self.hooks, PoolEvent("failover", space, "breaker_open"))
            raise NoHealthySpaceError(
                f"Space {space!r} is refusing work for now (circuit breaker open)",
                retry_after_s=max(1.0, health.retry_after(self._wall())),
            )
        while True:
            now = self._wall()
            usable = [
                n
                for n, sp in self.spaces.items()
                if sp.is_up()
                and n not in tried
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
            probes = [n for n in candidates if not board.get(n).admits()]
            if probes and not (pinned in candidates and board.get(pinned or "").admits()):
                choice = probes[0]  # recovery needs a probe: this request is it
                if not await board.take_probe(choice):
                    tried.append(choice)
                    continue
            else:
                closed = [n for n in candidates if board.get(n).admits()]
                choice = self.router.candidates(user, closed, lambda n: self.spaces[n].load())[0]
            if user is not None and pinned != choice:
                emit(self.hooks, PoolEvent("assignment", choice))
            return choice

    def _retry_after_down(self) -> float:
        """Seconds until the first Space marked down or breaker-open may be tried again."""
        now, wall = self._clock(), self._wall()
        waits = [sp.down_until - now for sp in self.spaces.values() if sp.down_until > now]
        waits += [
            w for n in self.spaces if (w := self.board.get(n).retry_after(wall)) > 0
        ]
        return round(max(1.0, min(waits)), 1) if waits else 1.0

    async def _release(self, lease: Lease) -> None:
        # Shielded: a cancelled caller must still give its slots back.
        await asyncio.shield(self.coordinator.release(lease))

    async def _record(self, name: str, outcome: Outcome) -> None:
        """Feed the shared window and breaker; a store outage never fails the request."""
        if outcome == "neutral" and self.board.get(name).breaker == "closed":
            return  # nothing to learn and no probe to hand back: skip the store
        try:
            await asyncio.shield(self.board.record(name, outcome))
        except (PoolError, OSError) as exc:
            _log.warning("space %s: could not record %s (%s)", name, outcome, exc)

    def _on_failure(self, sp: SpacePool, classified: Classified) -> None:
        kind = classified.error.kind
        if classified.provider_failure:
            emit(self.hooks, PoolEvent("provider_error", sp.name, kind))
        if kind in ("connect", "dropped") and not self.board.get(sp.name).waking(self._wall()):
            sp.mark_down(kind, _SPACE_COOLDOWN_S)
            emit(self.hooks, PoolEvent("failover", sp.name, kind))

    # -- maintenance: health checks and idle reaping ----------------------------------------
    async def _maintain(self) -> None:
        s = self.settings
        tick = max(0.05, min(s.health_interval_s, s.idle_timeout_s / 2, _PUBLISH_S))
        while True:
            await asyncio.sleep(tick)
            for sp in self.spaces.values():
                sp.reap_idle(s.idle_timeout_s)
            with contextlib.suppress(Exception):  # a store outage must not stop upkeep
                await self._publish()
            with contextlib.suppress(Exception):
                await self.board.refresh()
            with contextlib.suppress(Exception):
                await self._pause_idle()
            if self._clock() - self._last_health_at >= s.health_interval_s:
                await self.health_check()

    async def _pause_idle(self) -> None:
        """Idle pause (opt-in): Spaces with no leases and no waiters anywhere."""
        names = [n for n in self.spaces if self.waker.policy.pauses(n)]
        if not names:
            return
        snap = await self.coordinator.snapshot()
        for name in names:
            sp = self.spaces[name]
            resource = SPACE_PREFIX + name
            busy = bool(snap.held.get(resource) or snap.queued.get(resource) or sp.busy())
            await self.waker.maybe_pause(sp.spec, busy, sp.drop_idle)

    def _local_pools(self) -> dict[str, dict[str, Any]]:
        return {n: sp.snapshot(self.settings.health_failures) for n, sp in self.spaces.items()}

    async def _publish(self) -> None:
        """Share this process's connection snapshot with the fleet, with a TTL."""
        await self.coordinator.put_value(
            _PROCESS_PREFIX + self._process_id,
            json.dumps({"pools": self._local_pools(), "assignments": self.router.assignments}),
            ttl_s=3 * _PUBLISH_S,
        )

    async def _fleet_pools(self) -> tuple[dict[str, dict[str, Any]], int, int]:
        """Connection counts summed over every live process: (pools, processes, users)."""
        local = self._local_pools()
        if not self._started:
            return local, 1, 0
        try:
            await self._publish()
            published = await self.coordinator.values(_PROCESS_PREFIX)
        except Exception:
            return local, 1, self.router.assignments
        summed: dict[str, dict[str, Any]] = {n: dict.fromkeys(_SUMMED, 0) for n in local}
        users = 0
        for raw in published.values():
            try:
                other = json.loads(raw)
            except ValueError:
                continue
            users += int(other.get("assignments", 0))
            for name, entry in other.get("pools", {}).items():
                if name in summed:
                    for key in _SUMMED:
                        summed[name][key] += int(entry.get(key, 0))
        for name, entry in summed.items():
            local[name].update(entry)
        return local, max(1, len(published)), users

    async def health_check(self) -> None:
        """One round: probe ≤ ``health_sample`` idle connections per Space (SPEC 4.4)."""
        self._last_health_at = self._clock()
        self.health_running = True
        try:
            await asyncio.gather(*(self._check_space(sp) for sp in self.spaces.values()))
        finally:
            self.health_running = False
            self.last_health_check = datetime.now(UTC)

    async def _check_space(self, sp: SpacePool) -> None:
        assert self._http is not None
        s = self.settings
        if self.board.get(sp.name).waking(self._wall()):
            return  # booting: its wake deadline decides, not the health check
        sample = sp.idle_sample(s.health_sample)
        if not sample:
            if not sp.is_up() and sp.probe_url:
                with contextlib.suppress(Exception):
                    await sp.probe(self._http, sp.probe_url)
                    sp.down_until = 0.0  # answers again: let requests try it
            return
        for conn in sample:
            try:
                app_id = await sp.probe(self._http, conn.probe_url())
            except Exception:
                conn.failures += 1
                emit(self.hooks, PoolEvent("health", sp.name, "failed"))
                if not conn.is_healthy(s.health_failures):
                    sp.discard_idle(conn)
                continue
            conn.failures = 0
            if conn.app_id is not None and app_id != conn.app_id:
                emit(self.hooks, PoolEvent("health", sp.name, "restarted"))
                sp.restarted(app_id)
                return
            emit(self.hooks, PoolEvent("health", sp.name, "ok"))

    # -- statistics ---------------------------------------------------------------------------
    def wait_percentiles(self) -> dict[str, float]:
        waits = sorted(self._waits)
        if not waits:
            return {"p50": 0.0, "p95": 0.0, "p99": 0.0}

        def pct(q: float) -> float:
            return round(waits[min(len(waits) - 1, int(q * len(waits)))] * 1000, 1)

        return {"p50": pct(0.50), "p95": pct(0.95), "p99": pct(0.99)}

    def _health_stats(self, name: str) -> dict[str, Any]:
        if self._board is None:
            return {}
        h, now = self._board.get(name), self._wall()
        if h.paused:
            wake = "paused"
        elif h.waking(now):
            wake = "waking"
        else:
            cached = self.waker.cached_stage(name)
            wake = "sleeping" if cached == "SLEEPING" else "awake" if cached else "unknown"
            if self.spaces[name].total > 0:
                wake = "awake"
        return {
            "window": {
                "initial": h.initial,
                "current": h.window,
                "peak": h.peak,
                "ceiling": h.ceiling,
                "resourceCap": self.resource_cap.cap,
            },
            "breaker": {
                "state": h.breaker,
                "consecutiveFailures": h.failures,
                "openUntil": _iso(h.open_until) if h.breaker != "closed" else None,
                "transitions": h.transitions,
            },
            "wake": {"state": wake, "deadline": _iso(h.wake_until) if wake == "waking" else None},
        }

    async def stats(self) -> dict[str, Any]:
        """The pool-stats dict (SPEC 5) for the whole fleet sharing the coordinator.

        Connection counts are summed over every process that published a snapshot in
        the last few seconds; queue and in-flight figures come from the store itself.
        ``up``/``lastError``/``generation`` are this process's view.
        """
        s = self.settings
        snap = await self.coordinator.snapshot() if self._started else None
        pools, processes, users = await self._fleet_pools()
        for name, entry in pools.items():
            entry["queueLength"] = snap.queued.get(SPACE_PREFIX + name, 0) if snap else 0
            entry["maxConnections"] = s.max_connections
            entry["minConnections"] = s.min_connections
            entry["spaceInFlight"] = snap.held.get(SPACE_PREFIX + name, 0) if snap else 0
            entry.update(self._health_stats(name))
        totals = {
            key: sum(p[key] for p in pools.values())
            for key in ("totalConnections", "availableConnections", "inUseConnections")
        }
        return {
            "pools": pools,
            **totals,
            "totalQueued": snap.waiting if snap else 0,
            "userAssignments": max(users, self.router.assignments),
            "initialized": self._started,
            "healthCheckRunning": self.health_running,
            "lastHealthCheck": (
                self.last_health_check.isoformat().replace("+00:00", "Z")
                if self.last_health_check
                else None
            ),
            "processes": processes,
            "admission": {
                "store": snap.store if snap else None,
                "reachable": snap.reachable if snap else True,
                "globalInUse": snap.held.get(GLOBAL_RESOURCE, 0) if snap else 0,
                "globalLimit": s.global_max_concurrent,
                "consumerLimit": s.consumer_max_concurrent,
                "waitMs": self.wait_percentiles(),
            },
        }


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
