"""Warm-up ahead of demand (pool/connections/_warmth.py) against real stand-in Spaces.

Connections above the minimum are kept open while the peak in use over
``POOL_WARM_WINDOW_S`` needs them; with ``POOL_WARMUP`` the minimum opens at start.
"""

from __future__ import annotations

import asyncio

from devspaces import SpaceFleet
from pool import Pool
from tests.admission.helpers import until
from tests.conftest import PoolMaker

BURST = 6


def warm_pool(make_pool: PoolMaker, fleet: SpaceFleet, **kw: object) -> Pool:
    """Idle connections reaped after 0.2 s (a reaper tick every 0.1 s), minimum 1."""
    settings: dict[str, object] = {
        "min_connections": 1, "max_connections": 10, "idle_timeout_s": 0.2,
        "window_initial": 8, "global_max_concurrent": 20, "consumer_max_concurrent": 20,
    }  # fmt: skip
    settings.update(kw)
    return make_pool(fleet, **settings)


async def burst(pool: Pool) -> int:
    """``BURST`` concurrent calls on alpha; how many connections they opened."""
    sp = pool.spaces["alpha"]
    before = sp.opened_total
    await asyncio.gather(*(pool.predict("/echo", "x", 0.3, space="alpha") for _ in range(BURST)))
    return sp.opened_total - before


async def test_a_recurring_burst_finds_its_connections_open(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """Kept warm = peak in use over the window: after a burst of 6 the idle connections
    outlive POOL_IDLE_TIMEOUT_S, so the second burst opens at most 1 connection. (The
    peak is the Space's own: on a loaded machine the six calls may not all overlap.)"""
    pool = warm_pool(make_pool, clean_fleet, warm_window_s=60)
    clean_fleet["alpha"].reset()
    first = await burst(pool)
    peak = clean_fleet["alpha"].stats().peak
    await asyncio.sleep(1.0)  # five idle timeouts: without warmth they are reaped to 1
    sp = pool.spaces["alpha"]
    stats = await pool.stats()
    kept, minimum = stats["pools"]["alpha"]["keptWarm"], stats["pools"]["alpha"]["minConnections"]
    second = await burst(pool)
    print(f"\nwarmth: first burst opened {first} (peak at the Space {peak}), kept warm {kept}"
          f" (minimum {minimum}), open before the second {sp.total}, second burst opened"
          f" {second}")  # fmt: skip
    assert first >= 4, "the first burst should have opened connections"
    assert kept >= peak >= 4 and minimum == 1
    assert second <= 1


async def test_kept_warm_decays_once_the_peak_leaves_the_window(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """A peak older than POOL_WARM_WINDOW_S no longer counts: idle connections are then
    reaped down to the minimum as before."""
    pool = warm_pool(make_pool, clean_fleet, warm_window_s=0.3)
    assert await burst(pool) >= 4
    sp = pool.spaces["alpha"]
    await until(lambda: sp.total == 1, timeout=5, what="the reaper to close down to 1")
    assert sp.kept_warm == 1


async def test_warmup_opens_the_minimum_at_start(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """POOL_WARMUP=true: each Space's minimum opens at start, before any request."""
    pool = warm_pool(make_pool, clean_fleet, min_connections=2, warmup=True)
    await pool.start()
    await until(lambda: all(sp.total == 2 for sp in pool.spaces.values()), timeout=20,
                what="the warm-up connections")  # fmt: skip
    assert all(sp.opened_total == 2 for sp in pool.spaces.values())
