"""Admission cycle with 0 vs 10,000 stored jobs, per store (issue 13's row).

    .venv/bin/python scripts/bench_stored_jobs.py [--jobs 10000] [--workers 8] [--rounds 30]
                                                  [--cycles 200] [--shared-redis --redis URL]

For each store (memory, sqlite, redis) two coordinators run side by side in this
process, each on a store of its own (its own SQLite file; its own ``redis-server``,
which the script starts on loopback, so that one side's load cannot stall the other):
one holds no job, the other ``--jobs`` job mirrors (``job:<id>``, the JSON the
service writes, ~0.6 kB each). Both have the same background load that ``--workers``
(8) service workers put on their shared store while they run jobs, each:

* the cancel poller reads the ``jobcancel:`` values every 0.2 s;
* the running job's mirror is written 4 times a second;
* every second, the maintenance tick reads the health records (``health:``) and the
  published process counts (``proc:``).

The measured cycle is one task's uncontended ``acquire`` + ``release`` of exactly
what ``Pool.client`` asks for (``backend:global`` + ``space:<name>`` +
``consumer:<hash>``). Rounds alternate the two coordinators (which goes first
rotates); the figures are the median and p95 of the per-cycle latency over all
rounds, and the ratio with jobs / without: per round the ratio of the two medians,
then the median (min–max) of those (goal ≤ 1.1×); and the same for the means, which
show the stalls that a median skips.

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
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import redis
from _bench_cycle import LIMITS, RESOURCES  # the cycle row's lease: what Pool.client asks

from pool.admission import Coordinator, open_coordinator

RETENTION_S = 3600.0


def job_json(job_id: str) -> str:
    """A finished job's mirror as app/jobs/_shared.py writes it (same fields)."""
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


@contextlib.contextmanager
def redis_servers(args: argparse.Namespace) -> Iterator[list[str]]:
    """Two Redis servers of our own on loopback, one per side: a script that reads
    10,000 values stalls its whole server, so a shared one would slow both sides alike
    and hide the cost. Without ``redis-server`` on PATH: ``--redis``, shared."""
    binary = shutil.which("redis-server")
    if binary is None or args.shared_redis:
        tag = uuid.uuid4().hex[:8]
        sep = "&" if "?" in args.redis else "?"
        yield [f"{args.redis}{sep}prefix=bench-{tag}-{side}:" for side in ("empty", "jobs")]
        return
    procs, urls = [], []
    try:
        for _ in range(2):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            procs.append(subprocess.Popen(
                [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                 "--appendonly", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
            urls.append(f"redis://127.0.0.1:{port}/0")
        deadline = time.monotonic() + 10
        while not all(redis_reachable(url) for url in urls):
            if time.monotonic() > deadline:
                raise RuntimeError("the bench's redis-server did not start")
            time.sleep(0.05)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


@contextlib.contextmanager
def store_urls(kind: str, folder: str, args: argparse.Namespace) -> Iterator[list[str]]:
    if kind == "memory":
        yield ["memory://", "memory://"]
    elif kind == "sqlite":
        yield [f"sqlite:///{folder}/empty.db", f"sqlite:///{folder}/jobs.db"]
    else:
        with redis_servers(args) as urls:
            yield urls
            if "prefix=" in urls[0]:
                cleanup_redis(urls, args.redis)


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
        tasks = [
            asyncio.create_task(background(v, stop)) for v in values for _ in range(args.workers)
        ]
        for coord in coords:
            await cycles(coord, 50)  # warm up: scripts loaded, files open
        samples: list[list[float]] = [[], []]
        ratios: list[float] = []  # per round: median with jobs / median without
        mean_ratios: list[float] = []  # per round: the same of the means (stalls show)
        for r in range(args.rounds):
            order = [0, 1] if r % 2 == 0 else [1, 0]
            got: list[list[float]] = [[], []]
            for side in order:
                got[side] = await cycles(coords[side], args.cycles)
                samples[side].extend(got[side])
            ratios.append(statistics.median(got[1]) / statistics.median(got[0]))
            mean_ratios.append(statistics.fmean(got[1]) / statistics.fmean(got[0]))
        return {
            "store": kind,
            "fill_s": loaded,
            "empty": summary(samples[0]),
            "jobs": summary(samples[1]),
            "ratio": statistics.median(ratios),
            "ratio_range": (min(ratios), max(ratios)),
            "mean_ratio": statistics.median(mean_ratios),
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
    print(f"admission cycle, 0 vs {args.jobs} stored jobs, {args.workers} workers' value "
          f"traffic; {args.rounds} rounds x {args.cycles} cycles per side"
          f"{' (baseline API)' if args.baseline else ''}")
    print(f"{'store':8} {'0 jobs p50':>11} {'p95':>8} {'jobs p50':>10} {'p95':>8} "
          f"{'ratio of p50s (min-max)':>24} {'of means':>9}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-jobs-") as folder:
        for kind in args.stores:
            if kind == "redis" and not shutil.which("redis-server") \
                    and not redis_reachable(args.redis):
                print(f"{kind:8} not measured: no redis-server, no Redis at {args.redis}")
                continue
            with store_urls(kind, folder, args) as pair:
                row = await measure(kind, pair, args)
            rows.append(row)
            e, j = row["empty"], row["jobs"]
            print(f"{kind:8} {e['median_us']:9.0f}us {e['p95_us']:6.0f}us "
                  f"{j['median_us']:8.0f}us {j['p95_us']:6.0f}us "
                  f"{row['ratio']:9.2f}x ({row['ratio_range'][0]:.2f}-"
                  f"{row['ratio_range'][1]:.2f}) {row['mean_ratio']:8.2f}x")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--workers", type=int, default=8,
                        help="service workers whose background load is simulated")
    parser.add_argument("--stores", nargs="+", default=["memory", "sqlite", "redis"])
    parser.add_argument("--redis", default=os.environ.get("SPACEPOOL_BENCH_REDIS",
                                                          "redis://127.0.0.1:6379/15"))
    parser.add_argument("--shared-redis", action="store_true",
                        help="both sides on --redis (two prefixes) instead of two servers")
    parser.add_argument("--baseline", action="store_true",
                        help="the coordinator of a checkout from before the split")
    parser.add_argument("--json", help="also write the rows to this file")
    options = parser.parse_args()
    measured = asyncio.run(main(options))
    if options.json:
        Path(options.json).write_text(json.dumps(measured, indent=2))
