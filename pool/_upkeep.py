"""Maintenance of a pool, one loop per process (:class:`Upkeep`, started with the pool).

Every tick (at most ``PUBLISH_S``): close idle connections above the number kept warm
(:mod:`pool.connections._warmth`: the minimum, or the peak in use over a window), publish
this process's snapshot for fleet-wide stats, re-read the shared health records (other
processes' window and breaker changes; the windows re-applied as limits), pause owned
idle Spaces; every ``POOL_HEALTH_INTERVAL_S``: one health round (SPEC 4.4). A store
outage never stops the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import httpx

from ._clock import Clock
from ._events import Hook, PoolEvent, emit
from ._settings import PoolSettings
from ._stats import PUBLISH_S, Shared
from ._tasks import cancel_and_wait, cancelling, errors_ignored
from .admission import SPACE_PREFIX
from .connections import SpacePool, Warmth


class Upkeep:
    """The maintenance loop of one pool and the state of its health rounds."""

    def __init__(
        self,
        spaces: dict[str, SpacePool],
        settings: PoolSettings,
        hooks: list[Hook],
        clock: Clock,
        publish: Callable[[], Awaitable[None]],
    ) -> None:
        self._spaces = spaces
        self._settings = settings
        self._hooks = hooks
        self._clock = clock
        self._publish = publish
        self._task: asyncio.Task[None] | None = None
        self._last_round_at = 0.0
        self._last_round_wall = 0.0  # the same moment by the wall clock (nextHealthCheck)
        self.health_running = False
        self.warmth = Warmth(settings.warm_window_s, clock)
        self.last_health_check: datetime | None = None

    @property
    def next_health_check(self) -> datetime | None:
        """When the next health round is due (None before the pool started)."""
        if self._task is None:
            return None
        due = self._last_round_wall + self._settings.health_interval_s  # one value per round
        return datetime.fromtimestamp(due, UTC).replace(microsecond=0)

    def start(self, shared: Shared, http: httpx.AsyncClient) -> None:
        if self._settings.warmup:
            Warmth.warm_up(self._spaces)
        self._last_round_at = self._clock.now()
        self._last_round_wall = self._clock.wall()
        self._task = asyncio.get_running_loop().create_task(self._run(shared, http))

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _run(self, shared: Shared, http: httpx.AsyncClient) -> None:
        """Reap, publish, refresh shared health, pause, health-check; a store outage
        never stops the loop."""
        s = self._settings
        tick = max(0.05, min(s.health_interval_s, s.idle_timeout_s / 2, PUBLISH_S))
        while True:
            if cancelling():  # a cancel swallowed on its way still ends the loop
                raise asyncio.CancelledError
            await self._clock.sleep(tick)
            for sp in self._spaces.values():
                sp.reap_idle(s.idle_timeout_s, self.warmth.keep(sp))
            with errors_ignored():
                await self._publish()
            with errors_ignored():
                await shared.board.refresh()
            with errors_ignored():
                await self._pause_idle(shared)
            if self._clock.now() - self._last_round_at >= s.health_interval_s:
                await self.health_check(shared, http)

    async def _pause_idle(self, shared: Shared) -> None:
        """Idle pause (opt-in): Spaces with no leases and no waiters anywhere."""
        for name, sp in self._spaces.items():
            if not shared.waker.policy.pauses(name):
                continue
            resource = SPACE_PREFIX + name

            async def busy(sp: SpacePool = sp, resource: str = resource) -> bool:
                if sp.busy():
                    return True
                snap = await shared.coordinator.snapshot()
                return bool(snap.held.get(resource) or snap.queued.get(resource))

            # Busy (leases or waiters anywhere) is asked before the claim and again
            # after it: work admitted in between makes us hand the claim back.
            waker = shared.waker
            if not waker.may_claim_pause(sp.spec) or await busy():
                continue
            if not await waker.claim_pause(sp.spec):
                continue
            if await busy():
                await waker.unclaim_pause(sp.spec)
                continue
            sp.drop_idle()  # deregistered in the record first; now drop our connections
            await waker.pause(sp.spec)

    async def health_check(self, shared: Shared, http: httpx.AsyncClient) -> None:
        """One round: probe ≤ ``health_sample`` idle connections per Space (SPEC 4.4)."""
        self._last_round_at = self._clock.now()
        self._last_round_wall = self._clock.wall()
        self.health_running = True
        try:
            spaces = self._spaces.values()
            await asyncio.gather(*(self._check(shared, http, sp) for sp in spaces))
        finally:
            self.health_running = False
            self.last_health_check = datetime.fromtimestamp(self._clock.wall(), UTC)

    async def _check(self, shared: Shared, http: httpx.AsyncClient, sp: SpacePool) -> None:
        s = self._settings
        if shared.board.get(sp.name).waking(self._clock.wall()):
            return  # booting: its wake deadline decides, not the health check
        sample = sp.idle_sample(s.health_sample)
        if not sample:
            if not sp.is_up() and sp.probe_url:
                with errors_ignored():
                    await sp.probe(http, sp.probe_url)
                    sp.down_until = 0.0  # answers again: let requests try it
            return
        for conn in sample:
            try:
                app_id = await sp.probe(http, conn.probe_url(), conn.client.probe_headers())
            except Exception:
                conn.failures += 1
                emit(self._hooks, PoolEvent("health", sp.name, "failed"))
                if not conn.is_healthy(s.health_failures):
                    sp.discard_idle(conn)
                continue
            conn.failures = 0
            # Another replica's app_id (seen before) is no restart: pool/connections/_replicas.py.
            if conn.app_id is not None and app_id != conn.app_id and sp.replicas.is_restart(app_id):
                emit(self._hooks, PoolEvent("health", sp.name, "restarted"))
                sp.restarted(app_id)
                return
            emit(self._hooks, PoolEvent("health", sp.name, "ok"))
