"""Rolling activity for the dashboard: requests per minute, error classes, queue history.

The pool reports every finished lease and every busy rejection through its hooks
(:mod:`pool._events`); :meth:`Activity.on_event` counts them per Space in one-second
buckets kept for :data:`WINDOW_S` (15 minutes). Memory is bounded by Spaces × buckets ×
outcome classes: Spaces are the configured ones, outcome classes are the pool's short
``kind`` strings, and anything past :data:`MAX_CLASSES` per bucket is counted as
``other``. A sampler task (:func:`run_sampler`, started by the app's lifespan) records
the fleet's queue length (``totalQueued``, read from the admission store) every
:data:`SAMPLE_S` seconds into a deque that holds 15 minutes of samples.

With several workers each process counts what it served. :meth:`Activity.publish`
shares this process's summary through the coordinator's shared values, with a TTL as
the pool's own snapshots are, and :meth:`Activity.extend` sums the live summaries into
the pool-stats dict, so every worker answers with the fleet's figures:

* ``pools[name]["requestsPerMinute"]``: leases finished plus busy rejections in the
  last 60 s;
* ``pools[name]["errors"]``: ``{class: count}`` over the last 15 minutes (every outcome
  but ``ok``, and ``busy`` for rejections);
* ``queueHistory``: ``[[iso time, queue length], ...]``, oldest first;
* ``activity``: the fleet sums of the above, the window lengths and the sample period.

Events carry Space names and outcome classes only: never a user, a payload or a token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pool import Pool, PoolEvent
from pool.admission import Coordinator

WINDOW_S = 900  # error classes and queue history: the last 15 minutes
RATE_S = 60  # requests per minute: the last 60 s
SAMPLE_S = 2.0  # queue-length sampling period
MAX_CLASSES = 16  # outcome classes kept per bucket; more are counted as "other"
_PUBLISH_TTL_S = 5 * SAMPLE_S
_PREFIX = "dashboard:activity:"
_FLEET = ""  # the bucket key of events that name no Space

_log = logging.getLogger("spacepool.app")

Bucket = tuple[int, dict[str, int]]


def _iso(at: datetime) -> str:
    return at.isoformat(timespec="seconds").replace("+00:00", "Z")


class Activity:
    """Per-Space outcome counts in one-second buckets, and the queue-length samples."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._clock = clock
        self._wall = wall
        self._buckets: dict[str, deque[Bucket]] = {}
        self.queue: deque[tuple[str, int]] = deque(maxlen=int(WINDOW_S / SAMPLE_S))
        self.process_id = uuid.uuid4().hex[:12]

    # -- recording (plain functions, no await) ------------------------------------------
    def on_event(self, event: PoolEvent) -> None:
        """The pool hook: count finished leases and busy rejections."""
        if event.kind == "finished":
            outcome = event.outcome or "ok"
        elif event.kind == "busy":
            outcome = "busy"
        else:
            return
        now = int(self._clock())
        buckets = self._buckets.setdefault(event.space or _FLEET, deque())
        if not buckets or buckets[-1][0] != now:
            buckets.append((now, {}))
        counts = buckets[-1][1]
        if outcome not in counts and len(counts) >= MAX_CLASSES:
            outcome = "other"
        counts[outcome] = counts.get(outcome, 0) + 1
        self._prune(buckets, now)

    def record_queue(self, length: int) -> None:
        """One queue-length sample, stamped now."""
        self.queue.append((_iso(self._wall()), length))

    def _prune(self, buckets: deque[Bucket], now: int) -> None:
        while buckets and buckets[0][0] <= now - WINDOW_S:
            buckets.popleft()

    # -- reading ------------------------------------------------------------------------
    def summary(self) -> dict[str, dict[str, Any]]:
        """This process's counts: ``{space: {"requests": last 60 s, "errors": {...}}}``."""
        now = int(self._clock())
        out: dict[str, dict[str, Any]] = {}
        for name, buckets in list(self._buckets.items()):
            self._prune(buckets, now)
            if not buckets:
                del self._buckets[name]
                continue
            requests = 0
            errors: dict[str, int] = {}
            for second, counts in buckets:
                if second > now - RATE_S:
                    requests += sum(counts.values())
                for outcome, n in counts.items():
                    if outcome != "ok":
                        errors[outcome] = errors.get(outcome, 0) + n
            out[name] = {"requests": requests, "errors": errors}
        return out

    async def publish(self, coordinator: Coordinator) -> None:
        """Share this process's summary with the other workers, for a few seconds."""
        await coordinator.values.put(
            _PREFIX + self.process_id, json.dumps(self.summary()), ttl_s=_PUBLISH_TTL_S
        )

    async def fleet_summary(self, coordinator: Coordinator) -> dict[str, dict[str, Any]]:
        """Every live worker's summary, summed; this process's alone if the store fails."""
        try:
            await self.publish(coordinator)
            published = await coordinator.values.scan(_PREFIX)
        except Exception:
            _log.warning("activity of other workers unavailable; showing this worker's")
            return self.summary()
        summed: dict[str, dict[str, Any]] = {}
        for raw in published.values():
            try:
                other = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(other, dict):
                continue
            for name, entry in other.items():
                into = summed.setdefault(str(name), {"requests": 0, "errors": {}})
                into["requests"] += int(entry.get("requests", 0))
                for outcome, n in dict(entry.get("errors", {})).items():
                    into["errors"][outcome] = into["errors"].get(outcome, 0) + int(n)
        return summed

    async def extend(self, stats: dict[str, Any], coordinator: Coordinator | None) -> None:
        """Add the activity keys (module docstring) to a pool-stats dict, in place."""
        summed = await self.fleet_summary(coordinator) if coordinator else self.summary()
        total_requests = 0
        total_errors: dict[str, int] = {}
        pools: dict[str, dict[str, Any]] = stats.get("pools", {})
        for name, entry in pools.items():
            mine = summed.get(name, {"requests": 0, "errors": {}})
            entry["requestsPerMinute"] = mine["requests"]
            entry["errors"] = dict(sorted(mine["errors"].items()))
        for name, mine in summed.items():
            if name in pools or name == _FLEET:
                total_requests += mine["requests"]
                for outcome, n in mine["errors"].items():
                    total_errors[outcome] = total_errors.get(outcome, 0) + n
        stats["queueHistory"] = [[at, n] for at, n in self.queue]
        stats["activity"] = {
            "requestsPerMinute": total_requests,
            "errors": dict(sorted(total_errors.items())),
            "rateWindowS": RATE_S,
            "errorWindowS": WINDOW_S,
            "queueSampleS": SAMPLE_S,
        }


async def run_sampler(activity: Activity, pool: Pool, *, period_s: float = SAMPLE_S) -> None:
    """Until cancelled: sample the fleet's queue length and publish this worker's counts."""
    failing = False
    while True:
        try:
            snapshot = await pool.coordinator.snapshot()
            activity.record_queue(snapshot.waiting)
            await activity.publish(pool.coordinator)
            failing = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not failing:  # once per outage, not every period
                _log.warning("dashboard sampler: store unavailable (%s)", type(exc).__name__)
            failing = True
        await asyncio.sleep(period_s)
