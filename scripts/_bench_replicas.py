"""Rows of issue 31: replicas used to their real capacity, and the pool against the limit
the Spaces themselves impose.

* ``replicas``: two replicas of one app, each running 2 calls at once with a queue of 1
  (``concurrency_limit=2``, ``queue(max_size=1)``); 12 anonymous calls of ``S``, then
  12 more. The second wave's time against the capacity time ``12 × S / Σ limits``;
  the queue-full answers after the first wave.
* ``replicas-mixed``: three replicas running 1, 2 and 4 at once (queue 1 each) under a
  closed loop of twice as many callers: throughput against ``Σ limits / S``.
* ``limit`` — ``saturation vs the limit``: G calls at a time through the pool (a global
  cap of G, 3G callers) against an *oracle* that keeps exactly G calls in flight on the
  same Spaces with the native transport and no admission at all (the turnaround the
  Spaces themselves impose); ``latency vs the limit``: a 0 s predict through the pool
  against the same call on the native transport alone (one session, no pool).

Each round interleaves the compared variants. Times at the Spaces come from their own
clocks (devspaces records each call's start and end).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _bench_stats import Result, Summary, percentile, ratios

from devspaces import SpaceProcess
from pool import Pool, PoolEvent, PoolSettings
from pool._pool import _opener
from pool.transport import SpaceClient


def _settings(spaces: list[SpaceProcess], **extra: Any) -> PoolSettings:
    values: dict[str, Any] = {
        "spaces": ",".join(f"{s.name}={s.url}" for s in spaces),
        "coordinator_url": "memory://", "min_connections": 1, "queue_timeout_s": 120,
        "retry_attempts": 5, "retry_backoff_s": 0.05,
    }  # fmt: skip
    values.update(extra)
    return PoolSettings(**values)


def _started(spaces: list[SpaceProcess]) -> list[SpaceProcess]:
    for space in spaces:
        space.wait_ready(180)
    return spaces


async def replicas_rows(*, rounds: int, service_s: float) -> list[Result]:
    """Row ``replicas`` (see the module docstring)."""
    spaces = _started([SpaceProcess(f"rep-{c}", concurrency_limit=2, max_size=1, wait=False)
                       for c in "ab"])  # fmt: skip
    try:
        capacity = 12 * service_s / 4
        seconds, refused, windows = [], [], []
        for _ in range(rounds):
            for space in spaces:
                space.reset()
            # Anonymous callers share one consumer (issue 28): its cap out of the way,
            # the row is about the replicas.
            pool = Pool(_settings(spaces, anonymous_max_concurrent=100))
            try:
                await _wave(pool, 12, service_s)
                for space in spaces:
                    space.reset()
                sent = time.monotonic()
                await _wave(pool, 12, service_s)
                seconds.append(time.monotonic() - sent)
                refused.append(sum(space.stats().refused for space in spaces))
                windows.append([pool.board.get(s.name).window for s in spaces])
            finally:
                await pool.aclose()
    finally:
        for space in spaces:
            space.stop()
    ratio = [s / capacity for s in seconds]
    met = statistics.median(ratio) <= 1.15 and not any(refused)
    return [
        Result(
            "replicas", "replicas: 2 × (limit 2, queue 1), second wave of 12", "s",
            Summary.of(seconds), "pool", Summary.of([capacity] * len(seconds)),
            f"capacity 12 × {service_s} s / 4", "s", Summary.of(ratio), "times",
            "≤ 1.15 × capacity; no queue-full after wave 1", met,
            note=f"queue-full answers in the second wave per round: {refused}; windows "
            f"after it: {windows}",
        )
    ]


async def _wave(pool: Pool, n: int, service_s: float) -> None:
    await asyncio.gather(*(pool.predict("/echo", f"w{i}", service_s) for i in range(n)))


async def mixed_rows(*, rounds: int, service_s: float, seconds: float) -> list[Result]:
    """Row ``replicas-mixed``: limits 1, 2, 4 under a closed loop of 14 callers."""
    limits = {"mix-1": 1, "mix-2": 2, "mix-4": 4}
    spaces = _started([SpaceProcess(n, concurrency_limit=lim, max_size=1, wait=False)
                       for n, lim in limits.items()])  # fmt: skip
    ideal = sum(limits.values()) / service_s
    rates, windows = [], []
    try:
        for _ in range(rounds):
            pool = Pool(_settings(spaces, anonymous_max_concurrent=100))
            try:
                await _closed_loop(pool.predict, 14, service_s, seconds / 2)  # learning
                for space in spaces:
                    space.reset()
                t0 = time.time()
                await _closed_loop(pool.predict, 14, service_s, seconds)
                t1 = time.time()
                rates.append(_ended_between(spaces, t0, t1) / (t1 - t0))
                windows.append({s.name: pool.board.get(s.name).window for s in spaces})
            finally:
                await pool.aclose()
    finally:
        for space in spaces:
            space.stop()
    share = [r / ideal for r in rates]
    return [
        Result(
            "replicas-mixed", "replicas-mixed: limits 1, 2, 4, throughput", "/s",
            Summary.of(rates), "pool", Summary.of([ideal] * len(rates)),
            f"Σ limits / S = 7 / {service_s} s", "/s", Summary.of(share), "share",
            "≥ 90 % of Σ limits / S", statistics.median(share) >= 0.90,
            note=f"windows at the end of each round: {windows} (the Spaces run 1, 2, 4)",
        )
    ]


async def _closed_loop(
    predict: Callable[..., Awaitable[Any]], callers: int, service_s: float, seconds: float
) -> None:
    until = time.monotonic() + seconds

    async def caller() -> None:
        while time.monotonic() < until:
            await predict("/echo", "x", service_s)

    await asyncio.gather(*(caller() for _ in range(callers)))


def _ended_between(spaces: list[SpaceProcess], t0: float, t1: float) -> int:
    """Calls the Spaces ended in [t0, t1], by their own clocks."""
    return sum(1 for s in spaces for _start, end in s.intervals() if t0 <= end <= t1)


async def limit_rows(
    spaces: list[SpaceProcess], *, rounds: int, g: int, service_s: float, seconds: float,
    latency_calls: int,
) -> list[Result]:  # fmt: skip
    """Rows ``saturation vs the limit`` and ``latency vs the limit``."""
    settings = _settings(spaces, global_max_concurrent=g, anonymous_max_concurrent=1000,
                         window_initial=g, max_connections=4 * g)  # fmt: skip
    executor = ThreadPoolExecutor(2)
    opener = _opener(settings, None, None, executor, {})
    oracle = [await opener.open(spaces[i % len(spaces)].url) for i in range(g)]
    pool = Pool(settings)
    admitted: list[float] = []
    pool.hooks.append(lambda e: _note_wait(e, admitted))
    pool_rates, oracle_rates, pool_p50, native_p50 = [], [], [], []
    try:
        await _closed_loop(pool.predict, 3 * g, service_s, 2.0)  # warm: windows, connections
        for _ in range(rounds):
            for space in spaces:
                space.reset()
            t0 = time.time()
            await _closed_loop(pool.predict, 3 * g, service_s, seconds)
            t1 = time.time()
            pool_rates.append(_ended_between(spaces, t0, t1) / (t1 - t0))
            for space in spaces:
                space.reset()
            t0 = time.time()
            await asyncio.gather(*(_oracle_loop(c, service_s, seconds) for c in oracle))
            t1 = time.time()
            oracle_rates.append(_ended_between(spaces, t0, t1) / (t1 - t0))
            pool_p50.append(await _latency(lambda: pool.predict("/echo", "x", 0), latency_calls))
            native_p50.append(await _latency(lambda: _native_call(oracle[0], 0), latency_calls))
    finally:
        await pool.aclose()
        for client in oracle:
            await client.aclose()
        executor.shutdown(wait=False)
    sat = ratios(pool_rates, oracle_rates)
    lat = ratios(pool_p50, native_p50)
    return [
        Result(
            "limit", f"saturation vs the limit: G = {g}, {service_s} s calls, 3 Spaces", "/s",
            Summary.of(pool_rates), "pool", Summary.of(oracle_rates),
            f"oracle: native transport, {g} in flight, no admission", "/s", Summary.of(sat),
            "share", "≥ 98 % of the oracle", statistics.median(sat) >= 0.98,
            note=f"admission waits p99 {percentile(admitted, 99):.2f} s over the pool rounds",
        ),
        Result(
            "limit", "latency vs the limit: 0 s predict p50", "ms", Summary.of(pool_p50),
            "pool", Summary.of(native_p50), "native transport alone (one session)", "ms",
            Summary.of(lat), "times", "p50 ≤ 1.10 × native", statistics.median(lat) <= 1.10,
        ),
    ]


def _note_wait(event: PoolEvent, into: list[float]) -> None:
    if event.kind == "admitted":
        into.append(event.seconds)


async def _native_call(client: SpaceClient, delay_s: float) -> Any:
    return await client.submit("/echo", ("x", delay_s), {}, None, 4).result


async def _oracle_loop(client: SpaceClient, service_s: float, seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        await _native_call(client, service_s)


async def _latency(call: Callable[[], Awaitable[Any]], n: int) -> float:
    """p50 of ``n`` sequential calls, in ms."""
    took = []
    for _ in range(n):
        sent = time.perf_counter()
        await call()
        took.append((time.perf_counter() - sent) * 1000)
    return statistics.median(took)
