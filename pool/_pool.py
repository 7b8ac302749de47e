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
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx

from ._connection import ClientFactory, gradio_factory, quiet_gradio_env
from ._errors import Classified
from ._events import Hook, PoolEvent, emit
from ._exceptions import (
    BusyError,
    MisuseError,
    NoHealthySpaceError,
    PoolClosedError,
    PoolError,
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

_log = logging.getLogger("spacepool")
# Failures that mean the Space itself is unreachable: route around it.
_SPACE_DOWN_KINDS = frozenset({"connect", "dropped", "invalid_state", "not_found", "timeout"})
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


class Pool:
    """Warm gradio_client connections for several Spaces behind one admission."""

    def __init__(
        self,
        settings: PoolSettings | None = None,
        *,
        spaces: list[SpaceSpec] | None = None,
        client_factory: ClientFactory | None = None,
        coordinator: Coordinator | None = None,
        clock: Callable[[], float] = time.monotonic,
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
            limits = {
                GLOBAL_RESOURCE: s.global_max_concurrent,
                CONSUMER_PREFIX: s.consumer_max_concurrent,
            }
            limits.update({SPACE_PREFIX + name: s.max_connections for name in self.spaces})
            await self._coordinator.set_limits(limits)
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
    ) -> AsyncIterator[PooledClient]:
        """Admission, then an exclusive connection; everything released on exit."""
        await self.start()
        if space is not None and space not in self.spaces:
            raise UnknownSpace(space, list(self.spaces))
        user = self.hash_user(email)
        timeout = self.settings.queue_timeout_s if queue_timeout_s is None else queue_timeout_s
        deadline = self._clock() + timeout
        lease, sp, conn = await self._admit_and_checkout(user, space, deadline, ticket)
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

    async def _admit_and_checkout(
        self, user: str | None, space: str | None, deadline: float, ticket: WaitTicket | None
    ) -> tuple[Lease, SpacePool, Any]:
        tried: list[str] = []
        last_error: PoolError | None = None
        while True:
            name = self._choose(user, space, tried, last_error)
            sp = self.spaces[name]
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
                sp.mark_down(exc.kind, _SPACE_COOLDOWN_S)
                emit(self.hooks, PoolEvent("failover", name, exc.kind))
                _log.warning("space %s failed (%s); failing over", name, exc.kind)
                tried.append(name)
                last_error = exc
                continue
            except BaseException:
                await self._release(lease)
                raise
            if user is not None and space is None:
                self.router.repin(user, name)
            return lease, sp, conn

    def _choose(
        self, user: str | None, space: str | None, tried: list[str], last: PoolError | None
    ) -> str:
        if space is not None:
            if tried:
                raise NoHealthySpaceError(
                    f"Space {space!r} failed ({last.kind if last else '?'})",
                    retry_after_s=self._retry_after_down(),
                )
            return space
        healthy = [n for n, sp in self.spaces.items() if sp.is_up() and n not in tried]
        if not healthy:
            detail = f"; last failure: {last.kind}" if last else ""
            raise NoHealthySpaceError(
                f"every Space failed or is unhealthy{detail}",
                retry_after_s=self._retry_after_down(),
            )
        before = self.router.pinned(user) if user else None
        choice = self.router.candidates(user, healthy, lambda n: self.spaces[n].load())[0]
        if user is not None and before != choice:
            emit(self.hooks, PoolEvent("assignment", choice))
        return choice

    def _retry_after_down(self) -> float:
        """Seconds until the first Space marked down may be tried again."""
        now = self._clock()
        waits = [sp.down_until - now for sp in self.spaces.values() if sp.down_until > now]
        return round(max(1.0, min(waits)), 1) if waits else 1.0

    async def _release(self, lease: Lease) -> None:
        # Shielded: a cancelled caller must still give its slots back.
        await asyncio.shield(self.coordinator.release(lease))

    def _on_failure(self, sp: SpacePool, classified: Classified) -> None:
        kind = classified.error.kind
        if kind in ("connect", "dropped"):
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
            if self._clock() - self._last_health_at >= s.health_interval_s:
                await self.health_check()

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
