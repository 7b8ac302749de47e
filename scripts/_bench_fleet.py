"""Row "scale-redis-fleet" (issue 39, item 2): one Redis serves the fleet.

4 processes (8 tasks each) loop acquire + release on a free Space for a few seconds,
once against an empty store (the baseline) and once while another process keeps
10,000 waiters parked over 1,000 full Spaces (``--quick``: 1,000 over 100); rounds
alternate which comes first. Each side is a fresh key prefix of the same Redis. The
row reports the cycles per second of the 4 processes together (goal: ≥ 2,000/s with
the crowd) and their ratio to the baseline, plus the time per enqueue while the crowd
was filled (pipelined by the store's client, 32 operations per script run).

    python scripts/_bench_fleet.py [--quick]       # the row alone, printed
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

from _bench_stats import Result, Summary, not_measured

GOAL_CYCLES = 2000.0
PROCESSES = 4
TASKS = 8
GLOBAL = "backend:global"


def redis_url() -> str:
    return os.environ.get("SPACEPOOL_BENCH_REDIS", "redis://127.0.0.1:6379/0")


async def _worker(url: str, seconds: float, index: int) -> None:
    """One cycling process: wait for "go", loop for ``seconds``, print the count."""
    from pool.admission import open_coordinator

    coord = open_coordinator(url)
    resources = [GLOBAL, "space:free", f"consumer:bench-{index}"]
    # warm up: the script loaded, the connections open
    await coord.release(await coord.acquire(resources, timeout=30))
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    count = 0
    end = time.monotonic() + seconds

    async def loop() -> None:
        nonlocal count
        while time.monotonic() < end:
            lease = await coord.acquire(resources, timeout=30)
            await coord.release(lease)
            count += 1

    await asyncio.gather(*(loop() for _ in range(TASKS)))
    print(json.dumps({"cycles": count}), flush=True)
    await coord.aclose()


def _cycles(url: str, seconds: float) -> float:
    """Cycles per second of PROCESSES worker processes on ``url``, started together."""
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", url, str(seconds), str(i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline().strip()
            assert line == "ready", line
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        total = 0
        for p in procs:
            assert p.stdout is not None
            total += int(json.loads(p.stdout.readline())["cycles"])
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return total / seconds


async def _run_side(base: str, crowd: int, spaces: int, seconds: float) -> tuple[float, float]:
    """(cycles/s of the fleet, ms per enqueue while filling) on a fresh prefix."""
    from pool.admission import open_coordinator

    prefix = f"spacepool-bench-{uuid.uuid4().hex[:8]}:"
    url = f"{base}?prefix={prefix}&timeout_ms=5000"  # a loaded box: no spurious 503s
    parker = open_coordinator(url)
    waiting: list[asyncio.Task[Any]] = []
    per_enqueue_ms = float("nan")
    try:
        # The cyclers never wait: global room for all of them, their Space unlimited.
        limits = {GLOBAL: spaces + PROCESSES * TASKS + 8, "space:": 1, "space:free": 1 << 20}
        await parker.set_limits({**limits, "consumer:": 1 << 20})
        if crowd:
            await asyncio.gather(
                *(parker.acquire([GLOBAL, f"space:{s}"], timeout=60) for s in range(spaces))
            )
            start = time.perf_counter()
            waiting = [
                asyncio.create_task(
                    parker.acquire(
                        [GLOBAL, f"space:{i % spaces}", f"consumer:c{i % 100}"], timeout=3600
                    )
                )
                for i in range(crowd)
            ]
            while (await parker.snapshot()).waiting < crowd:
                await asyncio.sleep(0.01)
            per_enqueue_ms = (time.perf_counter() - start) * 1000 / crowd
        rate = await asyncio.to_thread(_cycles, url, seconds)
    finally:  # the close drops every lease and waiter, 256 per script run
        await parker.aclose()
        await asyncio.gather(*waiting, return_exceptions=True)
        _drop_prefix(base, prefix)
    return rate, per_enqueue_ms


def _drop_prefix(url: str, prefix: str) -> None:
    import redis

    with redis.Redis.from_url(url) as client:
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        for i in range(0, len(keys), 1000):
            client.delete(*keys[i : i + 1000])


async def _fill(parker: Any, spaces: int, crowd: int, backlog: int) -> list[Any]:
    """Every Space full, ``crowd`` waiters parked over them, ``backlog`` calls of one
    consumer queued past its limit; returns the tasks (the caller cancels them)."""
    limits = {GLOBAL: spaces + PROCESSES * TASKS + 8, "space:": 1, "space:free": 1 << 20}
    await parker.set_limits({**limits, "consumer:": 4})
    await asyncio.gather(
        *(parker.acquire([GLOBAL, f"space:{s}"], timeout=60) for s in range(spaces))
    )
    await asyncio.gather(
        *(parker.acquire(["space:free", "consumer:big"], timeout=60) for _ in range(4))
    )
    tasks = [
        asyncio.create_task(
            parker.acquire([GLOBAL, f"space:{i % spaces}", f"consumer:c{i % 100}"], timeout=3600)
        )
        for i in range(crowd)
    ]
    tasks += [
        asyncio.create_task(parker.acquire(["space:free", "consumer:big"], timeout=3600))
        for _ in range(backlog)
    ]
    while (await parker.snapshot()).waiting < crowd + backlog:
        await asyncio.sleep(0.01)
    return tasks


async def _ops_side(base: str, spaces: int, crowd: int, backlog: int, n: int) -> dict[str, float]:
    """Median ms of one process's acquire+release, and of a cancel, on a fresh prefix."""
    from pool.admission import WaitTicket, open_coordinator

    prefix = f"spacepool-bench-{uuid.uuid4().hex[:8]}:"
    url = f"{base}?prefix={prefix}&timeout_ms=5000"  # a loaded box: no spurious 503s
    parker, actor = open_coordinator(url), open_coordinator(url)
    tasks: list[Any] = []
    try:
        tasks = await _fill(parker, spaces, crowd, backlog)
        cycles, cancels = [], []
        for i in range(n):
            start = time.perf_counter()
            lease = await actor.acquire([GLOBAL, "space:free", "consumer:me"], timeout=30)
            await actor.release(lease)
            cycles.append(time.perf_counter() - start)
            ticket = WaitTicket()
            queued = actor.acquire([GLOBAL, f"space:{i % spaces}"], timeout=30, ticket=ticket)
            task = asyncio.create_task(queued)
            while ticket.position == 0:
                await asyncio.sleep(0)
            start = time.perf_counter()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            cancels.append(time.perf_counter() - start)
    finally:  # the close drops every lease and waiter, 256 per script run
        await actor.aclose()
        await parker.aclose()
        await asyncio.gather(*tasks, return_exceptions=True)
        _drop_prefix(base, prefix)
    return {"cycle": 1000 * statistics.median(cycles), "cancel": 1000 * statistics.median(cancels)}


async def ops_rows(base: str, *, quick: bool) -> list[Result]:
    """One process's operations on a crowded store against the same on a 1-waiter,
    1-Space store, sides interleaved (issue 39, item 4's figures for Redis)."""
    crowd, spaces = (1_000, 100) if quick else (10_000, 1_000)
    rounds, n = (1, 30) if quick else (3, 150)
    sides = {"small": (1, 1, 0), "crowd": (spaces, crowd, 0), "backlog": (1, 1, crowd)}
    got: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
    for r in range(rounds):
        for side in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            got[side].append(await _ops_side(base, *sides[side], n=n))

    def row(label: str, side: str, op: str) -> Result:
        ours = [g[op] for g in got[side]]
        small = [g[op] for g in got["small"]]
        return Result(
            "scale-redis-fleet",
            label,
            "ms",
            Summary.of(ours),
            "crowded",
            Summary.of(small),
            "1 waiter, 1 Space",
            ratio=Summary.of([a / b for a, b in zip(ours, small, strict=True)]),
            goal="≤ 1.5×",
            met=Summary.of(ours).median <= 1.5 * Summary.of(small).median,
            note=f"{rounds} rounds × {n} sequential operations, median per round; 1 process",
        )

    where = f"{crowd:,} waiters over {spaces:,} Spaces"
    return [
        row(f"Redis, 1 process: acquire+release, {where}", "crowd", "cycle"),
        row(f"Redis, 1 process: cancel of a waiter, {where}", "crowd", "cancel"),
        row(
            f"Redis, 1 process: acquire+release beside another consumer's {crowd:,}-call backlog",
            "backlog",
            "cycle",
        ),
    ]


async def fleet_rows(*, quick: bool) -> list[Result]:
    base = redis_url()
    crowd, spaces = (1_000, 100) if quick else (10_000, 1_000)
    rounds, seconds = (1, 1.0) if quick else (3, 3.0)
    label = f"Redis, {PROCESSES} processes, {crowd:,} waiters parked over {spaces:,} Spaces"
    try:
        import redis

        with redis.Redis.from_url(base, socket_connect_timeout=1) as client:
            client.ping()
    except Exception as exc:  # any failure: the row is not measured
        return [not_measured("scale-redis-fleet", label, "", f"no Redis at {base}: {exc}")]
    crowded: list[float] = []
    empty: list[float] = []
    fills: list[float] = []
    for r in range(rounds):
        for side in ("crowd", "empty") if r % 2 == 0 else ("empty", "crowd"):
            if side == "crowd":
                rate, fill = await _run_side(base, crowd, spaces, seconds)
                crowded.append(rate)
                fills.append(fill)
            else:
                empty.append((await _run_side(base, 0, spaces, seconds))[0])
    ours = Summary.of(crowded)
    fill = Summary.of(fills)
    return [
        *await ops_rows(base, quick=quick),
        Result(
            "scale-redis-fleet",
            f"{label}: acquire+release",
            "/s",
            ours,
            "crowded",
            Summary.of(empty),
            "empty store",
            ratio=Summary.of([a / b for a, b in zip(crowded, empty, strict=True)]),
            goal=f"≥ {GOAL_CYCLES:,.0f}/s crowded",
            met=ours.median >= GOAL_CYCLES,
            note=(
                f"{rounds} rounds × {seconds:g} s, sides interleaved; {TASKS} tasks per "
                f"process; filling the crowd: {fill.median:.3f} ms per enqueue "
                f"(median over rounds)"
            ),
            detail={"crowded": crowded, "empty": empty, "fill_ms_per_enqueue": fills},
        ),
    ]


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [os.path.dirname(here), here]
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        asyncio.run(_worker(sys.argv[2], float(sys.argv[3]), int(sys.argv[4])))
    else:
        for result in asyncio.run(fleet_rows(quick="--quick" in sys.argv)):
            print(" | ".join(result.cells()))
            print("   ", result.note)
