"""Statistics of a pool: this process's snapshot, the fleet's sum, the pool-stats dict.

Each process publishes its connection counts with a TTL through the coordinator's
shared values; ``collect`` sums every live snapshot, takes queue and in-flight figures
from the store itself and the window/breaker/wake state from the shared health board.
Metrics read these figures, they do not own them.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ._clock import Clock
from ._events import PoolEvent
from ._settings import PoolSettings
from .admission import GLOBAL_RESOURCE, SPACE_PREFIX, Coordinator, LiveWaits, summary
from .connections import SpacePool
from .resilience import HealthBoard, Waker
from .routing import Router

PUBLISH_S = 2.0
_FAILING = {"provider_error", "health", "finished"}  # events whose non-ok outcome is a failure
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
    "keptWarm",
)


@dataclass(frozen=True)
class Shared:
    """The fleet-wide parts a started pool reads its statistics from."""

    coordinator: Coordinator
    board: HealthBoard
    waker: Waker


class Stats:
    """This process's statistics: fed by the pool's hooks, published for the fleet."""

    def __init__(
        self,
        spaces: dict[str, SpacePool],
        settings: PoolSettings,
        router: Router,
        clock: Clock,
        process_id: str,
        resource_cap: int,
    ) -> None:
        self._spaces = spaces
        self._settings = settings
        self._router = router
        self._clock = clock
        self._key = PROCESS_PREFIX + process_id
        self._resource_cap = resource_cap
        self._waits: deque[float] = deque(maxlen=4096)  # admission waits (s), latest
        self.live_waits = LiveWaits(clock.wall)  # waits in progress (pool/admission/_live_waits.py)
        # Per Space, kept (not cleared by a success): the last failure, the last probe.
        self._last_failure: dict[str, dict[str, Any]] = {}
        self._last_probe: dict[str, dict[str, Any]] = {}
        self.shared: Shared | None = None  # set once the pool has started

    def on_event(self, event: PoolEvent) -> None:
        """A pool hook: admission waits feed the wait percentiles; failures and health
        probes are remembered per Space with their time."""
        if event.kind == "admitted":
            self._waits.append(event.seconds)
        if event.space is None:
            return
        at = _iso(self._clock.wall())
        if event.kind in _FAILING and event.outcome not in (None, "ok", "cancelled",
                                                            "caller_error"):
            self._last_failure[event.space] = {"kind": event.outcome, "at": at}
        if event.kind == "health":
            self._last_probe[event.space] = {"result": event.outcome, "at": at}

    def _local(self) -> dict[str, dict[str, Any]]:
        failures = self._settings.health_failures
        return {
            n: {**sp.snapshot(failures), "lastFailure": self._last_failure.get(n),
                "lastProbe": self._last_probe.get(n)}
            for n, sp in self._spaces.items()
        }  # fmt: skip

    async def publish(self) -> None:
        """Share this process's connection snapshot with the fleet, with a TTL."""
        if self.shared is None:
            return
        await self.shared.coordinator.values.put(
            self._key,
            json.dumps({"pools": self._local(), "assignments": self._router.assignments,
                        "waits": self.live_waits.oldest()}),
            ttl_s=3 * PUBLISH_S,
        )

    async def withdraw(self) -> None:
        """Remove this process's snapshot (the pool is closing)."""
        if self.shared is not None:
            await self.shared.coordinator.values.delete(self._key)

    async def _fleet_pools(self) -> tuple[dict[str, dict[str, Any]], int, int, list[float]]:
        """Connection counts summed over every live process, the latest failure and
        probe of any: (pools, processes, users, when the waits in progress began)."""
        local = self._local()
        if self.shared is None:
            return local, 1, 0, self.live_waits.oldest()
        try:
            await self.publish()
            published = await self.shared.coordinator.values.scan(PROCESS_PREFIX)
        except Exception:
            return local, 1, self._router.assignments, self.live_waits.oldest()
        summed: dict[str, dict[str, Any]] = {n: dict.fromkeys(_SUMMED, 0) for n in local}
        users = 0
        waits: list[float] = []
        for raw in published.values():
            try:
                other = json.loads(raw)
            except ValueError:
                continue
            users += int(other.get("assignments", 0))
            waits += [float(b) for b in other.get("waits", [])]
            for name, entry in other.get("pools", {}).items():
                if name in summed:
                    for key in _SUMMED:
                        summed[name][key] += int(entry.get(key, 0))
                    for key in ("lastFailure", "lastProbe"):  # the latest of any process
                        mine, theirs = local[name].get(key), entry.get(key)
                        if theirs and (not mine or theirs["at"] > mine["at"]):
                            local[name][key] = theirs
        for name, entry in summed.items():
            local[name].update(entry)
        return local, max(1, len(published)), users, waits

    def _health(self, name: str) -> dict[str, Any]:
        if self.shared is None:
            return {}
        h, now = self.shared.board.get(name), self._clock.wall()
        if h.paused:
            wake = "paused"
        elif h.waking(now):
            wake = "waking"
        else:
            cached = self.shared.waker.cached_stage(name)
            wake = "sleeping" if cached == "SLEEPING" else "awake" if cached else "unknown"
            if self._spaces[name].total > 0:
                wake = "awake"
        return {
            "window": {
                "initial": h.initial,
                "current": h.window,
                "peak": h.peak,
                "ceiling": h.ceiling,
                "resourceCap": self._resource_cap,
                # the most calls the Space ran at once with a worker free (0: not seen)
                "spaceRuns": h.floor,
            },
            "breaker": {
                "state": h.breaker,
                "consecutiveFailures": h.failures,
                "openUntil": _iso(h.open_until) if h.breaker != "closed" else None,
                "transitions": h.transitions,
            },
            "wake": {"state": wake, "deadline": _iso(h.wake_until) if wake == "waking" else None},
            # growth held at this window since the Space's own queue pushed back (None: not)
            "heldAt": h.held_at if h.held(now) else None,
        }

    async def collect(self, health_running: bool, last_check: datetime | None) -> dict[str, Any]:
        """The pool-stats dict (SPEC 5) for the whole fleet sharing the coordinator.

        Connection counts are summed over every process that published a snapshot in
        the last few seconds; queue and in-flight figures come from the store itself.
        ``up``/``lastError``/``generation`` are this process's view.
        """
        s = self._settings
        snap = await self.shared.coordinator.snapshot() if self.shared else None
        pools, processes, users, waits = await self._fleet_pools()
        for name, entry in pools.items():
            entry["queueLength"] = snap.queued.get(SPACE_PREFIX + name, 0) if snap else 0
            entry["maxConnections"] = s.max_connections
            entry["minConnections"] = s.min_connections
            entry["spaceInFlight"] = snap.held.get(SPACE_PREFIX + name, 0) if snap else 0
            entry.update(self._health(name))
        totals = {
            key: sum(p[key] for p in pools.values())
            for key in ("totalConnections", "availableConnections", "inUseConnections")
        }
        return {
            "pools": pools,
            **totals,
            "totalQueued": snap.waiting if snap else 0,
            "totalQueuedByClass": {
                "interactive": snap.waiting - snap.batch_waiting if snap else 0,
                "batch": snap.batch_waiting if snap else 0,
            },
            "userAssignments": max(users, self._router.assignments),
            "initialized": self.shared is not None,
            "healthCheckRunning": health_running,
            "lastHealthCheck": (
                last_check.isoformat().replace("+00:00", "Z") if last_check else None
            ),
            "processes": processes,
            "admission": {
                "store": snap.store if snap else None,
                "reachable": snap.reachable if snap else True,
                "globalInUse": snap.held.get(GLOBAL_RESOURCE, 0) if snap else 0,
                "globalLimit": s.global_max_concurrent,
                "consumerLimit": s.consumer_max_concurrent,
                "anonymousLimit": s.anonymous_limit,
                "waitMs": _percentiles(self._waits),
                # Waits still in progress, fleet-wide: the oldest and the p95 of their ages.
                "liveWaits": summary(waits, self._clock.wall()),
            },
        }


def _percentiles(waits_seen: Iterable[float]) -> dict[str, float]:
    """Admission waits (ms): p50, p95, p99."""
    waits = sorted(waits_seen)
    if not waits:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0}

    def pct(q: float) -> float:
        return round(waits[min(len(waits) - 1, int(q * len(waits)))] * 1000, 1)

    return {"p50": pct(0.50), "p95": pct(0.95), "p99": pct(0.99)}


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
