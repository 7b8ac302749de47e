"""Admission cycle with 0 vs 10,000 stored jobs, per store (issue 13's row).

    .venv/bin/python scripts/bench_stored_jobs.py [--jobs 10000] [--rounds 12]
                                                  [--cycles 300] [--redis URL]

For each store (memory, sqlite, redis) two coordinators run side by side in this
process, each on a store of its own (its own SQLite file, its own Redis key prefix):
one holds no job, the other ``--jobs`` job mirrors (``job:<id>``, the JSON the
service writes, ~0.6 kB each). Both have the same background load that a service
worker puts on its store while it runs jobs:

* the cancel poller reads the ``jobcancel:`` values every 0.2 s;
* the running job's mirror is written 4 times a second;
* every second, the maintenance tick reads the health records (``health:``) and the
  published process counts (``proc:``).

The measured cycle is one task's uncontended ``acquire`` + ``release`` of exactly
what ``Pool.client`` asks for (``backend:global`` + ``space:<name>`` +
``consumer:<hash>``). Rounds alternate the two coordinators (which goes first
rotates); the figures are the median and p95 of the per-cycle latency over all
rounds, and the ratio with jobs / without (goal ≤ 1.1×).

``--baseline`` runs the same load on a checkout from before the admission/values
split (its coordinator kept values itself: ``put_value``/``values``), to show what the
split changed: ``git worktree add /tmp/old <commit>`` and run this script there with
``PYTHONPATH=/tmp/old``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis

from pool.admission import (
    CONSUMER_PREFIX,
    GLOBAL_RESOURCE,
    SPACE_PREFIX,
    Coordinator,
    open_coordinator,
)

RESOURCES = [GLOBAL_RESOURCE, SPACE_PREFIX + "alpha", CONSUMER_PREFIX + "0123abcd"]
LIMITS = {GLOBAL_RESOURCE: 16, SPACE_PREFIX + "alpha": 50, CONSUMER_PREFIX: 2}
RETENTION_S = 3600.0


def job_json(job_id: str) -> str:
    """A finished job's mirror as app/_shared_jobs.py writes it (same fields)."""
    return json.dumps({
        "job_id": job_id, "stage": "done", "created_at": time.time(), "version": 7,
        "queue_position": None, "space": "alpha", "result": "alpha: " + "x" * 300,
        "error": None, "updated_at": time.time(), "partial": None, "partial_index": None,
        "attempts": 1, "queued_ms": 12.5, "duration_ms": 20311.0, "waking": False,
    })


class Values:
    """put/scan over either API: the split one (``coord.values``) or the old one."""

    def __init__(self, coord: Any, *, baseline: bool) -> None:
        self._coord = coord
        self._baseline = baseline

    async def put(self, key: str, value: str, ttl_s: float) -> None:
        if self._baseline:
            await self._coord.put_value(key, value, ttl_s)
        else:
            await self._coord.values.put(key, value, ttl_s)

    async def scan(self, prefix: str) -> dict[str, str]:
        if self._baseline:
            found: dict[str, str] = await self._coord.values(prefix)
        else:
            found = await self._coord.values.scan(prefix)
        return found


async def fill(values: Values, jobs: int) -> None:
    for start in range(0, jobs, 200):
        await asyncio.gather(*(
            values.put("job:" + uuid.uuid4().hex, job_json(str(i)), RETENTION_S)
            for i in range(start, min(jobs, start + 200))
        ))


async def background(values: Values, stop: asyncio.Event) -> None:
    """What one service worker running jobs does to its store besides admission."""
    running = "job:" + uuid.uuid4().hex

    async def every(period_s: float, step: Callable[[], Awaitable[object]]) -> None:
        while not stop.is_set():
            await step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period_s)

    async def maintenance() -> None:
        await values.scan("health:")
        await values.scan("proc:")

    await asyncio.gather(
        every(0.2, lambda: values.scan("jobcancel:")),
        every(0.25, lambda: values.put(running, job_json(running), RETENTION_S)),
        every(1.0, maintenance),
    )


async def cycles(coord: Coordinator, n: int) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        started = time.perf_counter()
        lease = await coord.acquire(RESOURCES, timeout=30)
        await coord.release(lease)
        out.append(time.perf_counter() - started)
    return out


def store_urls(kind: str, folder: str, redis_url: str) -> list[str]:
    if kind == "memory":
        return ["memory://", "memory://"]
    if kind == "sqlite":
        return [f"sqlite:///{folder}/empty.db", f"sqlite:///{folder}/jobs.db"]
    tag = uuid.uuid4().hex[:8]
    sep = "&" if "?" in redis_url else "?"
    return [f"{redis_url}{sep}prefix=bench-{tag}-{side}:" for side in ("empty", "jobs")]


async def measure(kind: str, url_pair: list[str], args: argparse.Namespace) -> dict[str, Any]:
    coords = [open_coordinator(url) for url in url_pair]
    stop = asyncio.Event()
    tasks: list[asyncio.Task[Any]] = []
    try:
        for coord in coords:
            await coord.set_limits(LIMITS)
        values = [Values(c, baseline=args.baseline) for c in coords]
        loaded = time.perf_counter()
        await fill(values[1], args.jobs)
        loaded = time.perf_counter() - loaded
        tasks = [asyncio.create_task(background(v, stop)) for v in values]
        for coord in coords:
            await cycles(coord, 50)  # warm up: scripts loaded, files open
        samples: list[list[float]] = [[], []]
        for r in range(args.rounds):
            order = [0, 1] if r % 2 == 0 else [1, 0]
            for side in order:
                samples[side].extend(await cycles(coords[side], args.cycles))
        return {
            "store": kind,
            "fill_s": loaded,
            "empty": summary(samples[0]),
            "jobs": summary(samples[1]),
        }
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for coord in coords:
            await coord.aclose()


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_us": statistics.median(ordered) * 1e6,
        "p95_us": ordered[int(0.95 * (len(ordered) - 1))] * 1e6,
        "mean_us": statistics.fmean(ordered) * 1e6,
    }


def redis_reachable(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def cleanup_redis(url_pair: list[str], base: str) -> None:
    client = redis.Redis.from_url(base)
    for url in url_pair:
        prefix = url.rsplit("prefix=", 1)[1]
        for key in client.scan_iter(match=prefix + "*", count=1000):
            client.delete(key)


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    print(f"admission cycle, 0 vs {args.jobs} stored jobs; {args.rounds} rounds x "
          f"{args.cycles} cycles per side{' (baseline API)' if args.baseline else ''}")
    print(f"{'store':8} {'0 jobs p50':>11} {'p95':>8} {'jobs p50':>10} {'p95':>8} "
          f"{'ratio p50':>10} {'ratio mean':>11}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-jobs-") as folder:
        for kind in args.stores:
            if kind == "redis" and not redis_reachable(args.redis):
                print(f"{kind:8} not measured: no Redis at {args.redis}")
                continue
            pair = store_urls(kind, folder, args.redis)
            try:
                row = await measure(kind, pair, args)
            finally:
                if kind == "redis":
                    cleanup_redis(pair, args.redis)
            rows.append(row)
            e, j = row["empty"], row["jobs"]
            print(f"{kind:8} {e['median_us']:9.0f}us {e['p95_us']:6.0f}us "
                  f"{j['median_us']:8.0f}us {j['p95_us']:6.0f}us "
                  f"{j['median_us'] / e['median_us']:9.2f}x "
                  f"{j['mean_us'] / e['mean_us']:10.2f}x")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--stores", nargs="+", default=["memory", "sqlite", "redis"])
    parser.add_argument("--redis", default=os.environ.get("SPACEPOOL_BENCH_REDIS",
                                                          "redis://127.0.0.1:6379/15"))
    parser.add_argument("--baseline", action="store_true",
                        help="the coordinator of a checkout from before the split")
    parser.add_argument("--json", help="also write the rows to this file")
    options = parser.parse_args()
    measured = asyncio.run(main(options))
    if options.json:
        Path(options.json).write_text(json.dumps(measured, indent=2))
