"""Maintenance of a pool, one loop per process (``Pool._maintain`` runs it).

Every tick (at most ``PUBLISH_S``): close idle connections above the minimum, publish
this process's snapshot for fleet-wide stats, re-read the shared health records (other
processes' window and breaker changes; the windows re-applied as limits), pause owned
idle Spaces; every ``POOL_HEALTH_INTERVAL_S``: one health round (SPEC 4.4). A store
outage never stops the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ._events import PoolEvent, emit
from ._space_pool import SpacePool
from ._stats import PUBLISH_S, publish
from .admission import SPACE_PREFIX

if TYPE_CHECKING:
    from ._pool import Pool


async def maintain(pool: Pool) -> None:
    """The maintenance loop: reap, publish, refresh shared health, pause, health-check."""
    s = pool.settings
    tick = max(0.05, min(s.health_interval_s, s.idle_timeout_s / 2, PUBLISH_S))
    while True:
        await pool.clock.sleep(tick)
        for sp in pool.spaces.values():
            sp.reap_idle(s.idle_timeout_s)
        with contextlib.suppress(Exception):  # a store outage must not stop upkeep
            await publish(pool)
        with contextlib.suppress(Exception):
            await pool.board.refresh()
        with contextlib.suppress(Exception):
            await pause_idle(pool)
        if pool.clock.now() - pool._last_health_at >= s.health_interval_s:
            await health_check(pool)


async def pause_idle(pool: Pool) -> None:
    """Idle pause (opt-in): Spaces with no leases and no waiters anywhere."""
    names = [n for n in pool.spaces if pool.waker.policy.pauses(n)]
    if not names:
        return
    for name in names:
        sp = pool.spaces[name]
        resource = SPACE_PREFIX + name

        async def busy(sp: SpacePool = sp, resource: str = resource) -> bool:
            if sp.busy():
                return True
            snap = await pool.coordinator.snapshot()
            return bool(snap.held.get(resource) or snap.queued.get(resource))

        await pool.waker.maybe_pause(sp.spec, busy, sp.drop_idle)


async def health_check(pool: Pool) -> None:
    """One round: probe ≤ ``health_sample`` idle connections per Space (SPEC 4.4)."""
    pool._last_health_at = pool.clock.now()
    pool.health_running = True
    try:
        await asyncio.gather(*(check_space(pool, sp) for sp in pool.spaces.values()))
    finally:
        pool.health_running = False
        pool.last_health_check = datetime.now(UTC)


async def check_space(pool: Pool, sp: SpacePool) -> None:
    assert pool._http is not None
    s = pool.settings
    if pool.board.get(sp.name).waking(pool.clock.wall()):
        return  # booting: its wake deadline decides, not the health check
    sample = sp.idle_sample(s.health_sample)
    if not sample:
        if not sp.is_up() and sp.probe_url:
            with contextlib.suppress(Exception):
                await sp.probe(pool._http, sp.probe_url)
                sp.down_until = 0.0  # answers again: let requests try it
        return
    for conn in sample:
        try:
            app_id = await sp.probe(pool._http, conn.probe_url())
        except Exception:
            conn.failures += 1
            emit(pool.hooks, PoolEvent("health", sp.name, "failed"))
            if not conn.is_healthy(s.health_failures):
                sp.discard_idle(conn)
            continue
        conn.failures = 0
        if conn.app_id is not None and app_id != conn.app_id:
            emit(pool.hooks, PoolEvent("health", sp.name, "restarted"))
            sp.restarted(app_id)
            return
        emit(pool.hooks, PoolEvent("health", sp.name, "ok"))
