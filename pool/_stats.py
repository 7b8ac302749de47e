"""Statistics of a pool: this process's snapshot, the fleet's sum, the pool-stats dict.

Each process publishes its connection counts with a TTL through the coordinator's
shared values; ``collect`` sums every live snapshot, takes queue and in-flight figures
from the store itself and the window/breaker/wake state from the shared health board.
Metrics read these figures, they do not own them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .admission import GLOBAL_RESOURCE, SPACE_PREFIX

if TYPE_CHECKING:
    from ._pool import Pool

PUBLISH_S = 2.0
PROCESS_PREFIX = "proc:"
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


def local_pools(pool: Pool) -> dict[str, dict[str, Any]]:
    return {n: sp.snapshot(pool.settings.health_failures) for n, sp in pool.spaces.items()}


async def publish(pool: Pool) -> None:
    """Share this process's connection snapshot with the fleet, with a TTL."""
    await pool.coordinator.put_value(
        PROCESS_PREFIX + pool._process_id,
        json.dumps({"pools": local_pools(pool), "assignments": pool.router.assignments}),
        ttl_s=3 * PUBLISH_S,
    )


async def fleet_pools(pool: Pool) -> tuple[dict[str, dict[str, Any]], int, int]:
    """Connection counts summed over every live process: (pools, processes, users)."""
    local = local_pools(pool)
    if not pool._started:
        return local, 1, 0
    try:
        await publish(pool)
        published = await pool.coordinator.values(PROCESS_PREFIX)
    except Exception:
        return local, 1, pool.router.assignments
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


def wait_percentiles(waits_seen: Iterable[float]) -> dict[str, float]:
    waits = sorted(waits_seen)
    if not waits:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0}

    def pct(q: float) -> float:
        return round(waits[min(len(waits) - 1, int(q * len(waits)))] * 1000, 1)

    return {"p50": pct(0.50), "p95": pct(0.95), "p99": pct(0.99)}


def health_stats(pool: Pool, name: str) -> dict[str, Any]:
    if pool._board is None:
        return {}
    h, now = pool._board.get(name), pool.clock.wall()
    if h.paused:
        wake = "paused"
    elif h.waking(now):
        wake = "waking"
    else:
        cached = pool.waker.cached_stage(name)
        wake = "sleeping" if cached == "SLEEPING" else "awake" if cached else "unknown"
        if pool.spaces[name].total > 0:
            wake = "awake"
    return {
        "window": {
            "initial": h.initial,
            "current": h.window,
            "peak": h.peak,
            "ceiling": h.ceiling,
            "resourceCap": pool.resource_cap.cap,
        },
        "breaker": {
            "state": h.breaker,
            "consecutiveFailures": h.failures,
            "openUntil": _iso(h.open_until) if h.breaker != "closed" else None,
            "transitions": h.transitions,
        },
        "wake": {"state": wake, "deadline": _iso(h.wake_until) if wake == "waking" else None},
    }


async def collect(pool: Pool) -> dict[str, Any]:
    """The pool-stats dict (SPEC 5) for the whole fleet sharing the coordinator.

    Connection counts are summed over every process that published a snapshot in
    the last few seconds; queue and in-flight figures come from the store itpool.
    ``up``/``lastError``/``generation`` are this process's view.
    """
    s = pool.settings
    snap = await pool.coordinator.snapshot() if pool._started else None
    pools, processes, users = await fleet_pools(pool)
    for name, entry in pools.items():
        entry["queueLength"] = snap.queued.get(SPACE_PREFIX + name, 0) if snap else 0
        entry["maxConnections"] = s.max_connections
        entry["minConnections"] = s.min_connections
        entry["spaceInFlight"] = snap.held.get(SPACE_PREFIX + name, 0) if snap else 0
        entry.update(health_stats(pool, name))
    totals = {
        key: sum(p[key] for p in pools.values())
        for key in ("totalConnections", "availableConnections", "inUseConnections")
    }
    return {
        "pools": pools,
        **totals,
        "totalQueued": snap.waiting if snap else 0,
        "userAssignments": max(users, pool.router.assignments),
        "initialized": pool._started,
        "healthCheckRunning": pool.health_running,
        "lastHealthCheck": (
            pool.last_health_check.isoformat().replace("+00:00", "Z")
            if pool.last_health_check
            else None
        ),
        "processes": processes,
        "admission": {
            "store": snap.store if snap else None,
            "reachable": snap.reachable if snap else True,
            "globalInUse": snap.held.get(GLOBAL_RESOURCE, 0) if snap else 0,
            "globalLimit": s.global_max_concurrent,
            "consumerLimit": s.consumer_max_concurrent,
            "waitMs": wait_percentiles(pool._waits),
        },
    }


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
