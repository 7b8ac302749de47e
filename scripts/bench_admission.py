"""Admission benchmark: cycles per second and hand-off latency, per store.

    .venv/bin/python scripts/bench_admission.py [--quick] [--redis URL] [--seconds S]

Two measurements per store (memory, sqlite, redis) with 1 and 4 processes, plus
``anyio.CapacityLimiter`` as the in-process yardstick:

* **cycles/s** — 8 tasks per process loop acquire → yield → release on
  ``backend:global`` + a Space, with the global limit at 4 per process, so about
  half of the acquires queue and are woken by a hand-off.
* **hand-off** — the global limit is 1 and 4 contenders (tasks in one process, or
  one task in each of 4 processes) hold it for 1 ms each; the latency is the time
  from the holder calling ``release`` to the next holder's ``acquire`` returning.
  CLOCK_MONOTONIC is one clock for every process on Linux, so cross-process
  latencies are measured directly.

Worker processes are this script re-run with ``--worker``; they report JSON on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

import anyio
import redis

if "--worker" in sys.argv:  # load pool.admission only, not pool/__init__ (gradio_client…)
    _package = types.ModuleType("pool")
    _package.__path__ = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pool")]
    sys.modules["pool"] = _package

from pool.admission import (
    GLOBAL_RESOURCE,
    Coordinator,
    MemoryCoordinator,
    open_coordinator,
)

TASKS = 8
SLOTS_PER_PROCESS = 4
CONTENDERS = 4
HOLD_S = 0.001
RESOURCES = [GLOBAL_RESOURCE, "space:bench"]

Records = list[tuple[int, int]]


# -- the two measurements, for one process ------------------------------------------------------
async def cycles(acquire_release: Callable[[], Awaitable[None]], seconds: float) -> int:
    count = 0
    deadline = time.monotonic() + seconds

    async def loop() -> None:
        nonlocal count
        while time.monotonic() < deadline:
            await acquire_release()
            count += 1

    await asyncio.gather(*(loop() for _ in range(TASKS)))
    return count


async def coordinator_cycles(coord: Coordinator, seconds: float) -> int:
    async def once() -> None:
        lease = await coord.acquire(RESOURCES, timeout=60)
        await asyncio.sleep(0)
        await coord.release(lease)

    return await cycles(once, seconds)


async def limiter_cycles(seconds: float) -> int:
    limiter = anyio.CapacityLimiter(SLOTS_PER_PROCESS)

    async def once() -> None:
        async with limiter:
            await asyncio.sleep(0)

    return await cycles(once, seconds)


async def handoffs(
    hold: Callable[[Records], Awaitable[None]], tasks: int, seconds: float
) -> Records:
    records: Records = []
    deadline = time.monotonic() + seconds

    async def loop() -> None:
        while time.monotonic() < deadline:
            await hold(records)

    await asyncio.gather(*(loop() for _ in range(tasks)))
    return records


async def coordinator_handoffs(coord: Coordinator, tasks: int, seconds: float) -> Records:
    async def hold(records: Records) -> None:
        lease = await coord.acquire([GLOBAL_RESOURCE], timeout=60)
        granted = time.monotonic_ns()
        await asyncio.sleep(HOLD_S)
        releasing = time.monotonic_ns()
        await coord.release(lease)
        records.append((granted, releasing))

    return await handoffs(hold, tasks, seconds)


async def limiter_handoffs(seconds: float) -> Records:
    limiter = anyio.CapacityLimiter(1)

    async def hold(records: Records) -> None:
        async with limiter:
            granted = time.monotonic_ns()
            await asyncio.sleep(HOLD_S)
            releasing = time.monotonic_ns()
        records.append((granted, releasing))

    return await handoffs(hold, CONTENDERS, seconds)


def handoff_latencies_ms(records: Records) -> list[float]:
    """Next grant minus previous release, over the single slot's history."""
    ordered = sorted(records)
    return [(b[0] - a[1]) / 1e6 for a, b in itertools.pairwise(ordered)]


# -- worker processes --------------------------------------------------------------------------
async def worker(url: str, seconds: float) -> None:
    """Phase 1 cycles, phase 2 hand-offs; each starts on a "go" line from the parent."""
    coord = open_coordinator(url, lease_ttl_s=10)
    await coord.snapshot()
    loop = asyncio.get_running_loop()
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    count = await coordinator_cycles(coord, seconds)
    print(json.dumps({"cycles": count}), flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    records = await coordinator_handoffs(coord, 1, seconds)
    print(json.dumps({"records": records}), flush=True)
    await coord.aclose()


class Fleet:
    """N worker processes driven phase by phase."""

    def __init__(self, url: str, n: int, seconds: float) -> None:
        self.procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", url, "--seconds", str(seconds)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(n)
        ]
        for line in self._lines():
            assert line == "ready", line

    def _lines(self) -> list[str]:
        return [p.stdout.readline().strip() for p in self.procs if p.stdout is not None]

    def phase(self) -> list[dict[str, object]]:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        return [json.loads(line) for line in self._lines()]

    def close(self) -> None:
        for p in self.procs:
            p.wait(timeout=30)


# -- the table --------------------------------------------------------------------------------
@dataclass
class Row:
    store: str
    processes: int
    cycles_per_s: float
    latencies_ms: list[float]

    def p(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        return statistics.quantiles(self.latencies_ms, n=100, method="inclusive")[int(q) - 1]


async def measure_in_process(name: str, url: str | None, seconds: float) -> Row:
    if url is None:
        count = await limiter_cycles(seconds)
        records = await limiter_handoffs(seconds)
        return Row(name, 1, count / seconds, handoff_latencies_ms(records))
    coord: Coordinator = MemoryCoordinator() if url == "memory://" else open_coordinator(url)
    try:
        await coord.set_limits({GLOBAL_RESOURCE: SLOTS_PER_PROCESS})
        count = await coordinator_cycles(coord, seconds)
        await coord.set_limits({GLOBAL_RESOURCE: 1})
        records = await coordinator_handoffs(coord, CONTENDERS, seconds)
    finally:
        await coord.aclose()
    return Row(name, 1, count / seconds, handoff_latencies_ms(records))


async def measure_fleet(name: str, url: str, n: int, seconds: float) -> Row:
    setter = open_coordinator(url)
    try:
        await setter.set_limits({GLOBAL_RESOURCE: SLOTS_PER_PROCESS * n})
        fleet = await asyncio.to_thread(Fleet, url, n, seconds)
        results = await asyncio.to_thread(fleet.phase)
        count = sum(int(str(r["cycles"])) for r in results)
        await setter.set_limits({GLOBAL_RESOURCE: 1})
        results = await asyncio.to_thread(fleet.phase)
        await asyncio.to_thread(fleet.close)
    finally:
        await setter.aclose()
    pairs = [cast(list[list[int]], r["records"]) for r in results]
    records: Records = [(int(a), int(b)) for each in pairs for a, b in each]
    return Row(name, n, count / seconds, handoff_latencies_ms(records))


def redis_reachable(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=1) as r:
            return bool(r.ping())
    except redis.RedisError:
        return False


async def main(args: argparse.Namespace) -> None:
    seconds = args.seconds or (0.7 if args.quick else 3.0)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        stores: list[tuple[str, str]] = [("sqlite", f"sqlite:///{tmp}/bench.db")]
        prefix = f"bench-{uuid.uuid4().hex[:8]}:"
        if redis_reachable(args.redis):
            stores.append(("redis", f"{args.redis}?prefix={prefix}"))
        else:
            print(f"(redis at {args.redis} unreachable: skipped)", file=sys.stderr)
        rows.append(await measure_in_process("anyio.CapacityLimiter", None, seconds))
        rows.append(await measure_in_process("memory", "memory://", seconds))
        for name, url in stores:
            rows.append(await measure_in_process(name, url, seconds))
            rows.append(await measure_fleet(name, url, 4, seconds))
        if len(stores) > 1:
            with redis.Redis.from_url(args.redis) as r:
                keys = list(r.scan_iter(match=prefix + "*"))
                if keys:
                    r.delete(*keys)
    base = rows[0].cycles_per_s
    print(f"\n{len(rows)} runs of {seconds:.1f}s; cycles: {TASKS} tasks/process, "
          f"limit {SLOTS_PER_PROCESS}/process; hand-off: limit 1, {CONTENDERS} contenders, "
          f"{HOLD_S * 1000:.0f} ms hold")
    print(f"{'store':<22} {'procs':>5} {'cycles/s':>10} {'vs limiter':>11} "
          f"{'hand-off p50':>13} {'p99':>9} {'n':>6}")
    for row in rows:
        ratio = f"{row.cycles_per_s / base:.2f}x" if row.processes == 1 else ""
        print(f"{row.store:<22} {row.processes:>5} {row.cycles_per_s:>10,.0f} {ratio:>11} "
              f"{row.p(50):>10.2f} ms {row.p(99):>6.2f} ms {len(row.latencies_ms):>6}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (< 30 s in all)")
    parser.add_argument("--seconds", type=float, default=0.0, help="length of each run")
    parser.add_argument("--redis", default=os.environ.get("SPACEPOOL_BENCH_REDIS",
                                                          "redis://127.0.0.1:6379/0"))
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.worker:
        asyncio.run(worker(ns.worker, ns.seconds))
    else:
        asyncio.run(main(ns))
