"""Rows "CapacityLimiter", "QueuePool" and "fairness": admission in one process.

Cycle: one task, uncontended, ``acquire`` + ``release`` of the pool's admission — a
:class:`~pool.admission.MemoryCoordinator` lease on ``backend:global`` +
``space:<name>`` + ``consumer:<hash>``, exactly what ``Pool.client`` asks for — against
``anyio.CapacityLimiter`` (``async with limiter``) and SQLAlchemy's ``QueuePool``
(``connect()`` + ``close()`` with a trivial creator). Rounds interleave the three
(rotating which goes first); the figure is µs per cycle.

Fairness: the harness of asyncpg issue #1247 — 100 callers, a cap of 10, each
holding its slot 200 ms, acquire timeout 10 s — on the coordinator, memory store,
next to ``anyio.CapacityLimiter`` in the same harness. "once": every caller acquires
once; "loop": every caller loops acquire → hold → release for a while (the issue's
own program), so released callers queue again behind the others.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from _bench_stats import Result, Summary, not_measured, ratios

from pool.admission import (
    CONSUMER_PREFIX,
    GLOBAL_RESOURCE,
    SPACE_PREFIX,
    MemoryCoordinator,
)

RESOURCES = [GLOBAL_RESOURCE, SPACE_PREFIX + "alpha", CONSUMER_PREFIX + "0123abcd"]
LIMITS = {GLOBAL_RESOURCE: 16, SPACE_PREFIX + "alpha": 50, CONSUMER_PREFIX: 2}


class _TrivialDBAPIConnection:
    """What QueuePool checks out: nothing to do on rollback or close."""

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        pass


async def coordinator_cycles(coord: MemoryCoordinator, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        lease = await coord.acquire(RESOURCES, timeout=30)
        await coord.release(lease)
    return time.perf_counter() - started


async def limiter_cycles(limiter: anyio.CapacityLimiter, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        async with limiter:
            pass
    return time.perf_counter() - started


def queuepool_cycles(pool: Any, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        conn = pool.connect()
        conn.close()
    return time.perf_counter() - started


async def cycle_rows(*, rounds: int, cycles: int) -> list[Result]:
    coord = MemoryCoordinator()
    await coord.set_limits(LIMITS)
    limiter = anyio.CapacityLimiter(16)

    variants: dict[str, Callable[[int], Awaitable[float]]] = {
        "ours": lambda n: coordinator_cycles(coord, n),
        "limiter": lambda n: limiter_cycles(limiter, n),
    }
    qpool: Any = None
    try:
        from sqlalchemy.pool import QueuePool
    except ImportError:  # the test extra brings it; say so rather than fail the run
        pass
    else:

        def creator() -> Any:
            return _TrivialDBAPIConnection()

        qpool = QueuePool(creator, pool_size=16, max_overflow=0, timeout=30)

        async def qp(n: int) -> float:
            return queuepool_cycles(qpool, n)

        variants["queuepool"] = qp
    for run in variants.values():  # warm up
        await run(max(100, cycles // 10))
    per_cycle_us: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            per_cycle_us[name].append(await variants[name](cycles) / cycles * 1e6)
    ours = per_cycle_us["ours"]
    note = f"{rounds} rounds × {cycles:,} cycles each, one task, uncontended"
    vs_limiter = Summary.of(ratios(ours, per_cycle_us["limiter"]))
    results = [
        Result(
            "cycle",
            "CapacityLimiter: acquire+release cycle",
            "µs",
            Summary.of(ours),
            "coordinator (memory)",
            Summary.of(per_cycle_us["limiter"]),
            "anyio.CapacityLimiter",
            ratio=vs_limiter,
            goal="≤ 3× the limiter",
            met=vs_limiter.median <= 3.0,
            note=note,
            detail={"per_cycle_us": per_cycle_us},
        )
    ]
    if qpool is None:
        results.append(
            not_measured(
                "cycle", "QueuePool: checkout+checkin cycle", "< 1×", "sqlalchemy not installed"
            )
        )
        return results
    qpool.dispose()
    vs_queuepool = Summary.of(ratios(ours, per_cycle_us["queuepool"]))
    results.append(
        Result(
            "cycle",
            "QueuePool: checkout+checkin cycle",
            "µs",
            Summary.of(ours),
            "coordinator (memory)",
            Summary.of(per_cycle_us["queuepool"]),
            "SQLAlchemy QueuePool",
            ratio=vs_queuepool,
            goal="< 1× (faster than QueuePool)",
            met=vs_queuepool.median < 1.0,
            note=note,
            detail={"per_cycle_us": per_cycle_us},
        )
    )
    return results


# -- fairness --------------------------------------------------------------------------------
CALLERS = 100
CAP = 10
HOLD_S = 0.2
ACQUIRE_TIMEOUT_S = 10.0
IDEAL_MAX_WAIT_S = math.ceil(CALLERS / CAP) * HOLD_S


class _Harness:
    """Waits, holds and timeouts of one run of the asyncpg #1247 harness."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.holds: list[float] = []
        self.timeouts = 0


Slot = Callable[[int], Any]  # caller index -> async context manager holding one slot


async def run_harness(slot: Slot, *, loop_for_s: float | None) -> _Harness:
    h = _Harness()
    stop_at = time.monotonic() + (loop_for_s or 0.0)

    async def caller(i: int) -> None:
        while True:
            asked = time.monotonic()
            try:
                async with slot(i):
                    got = time.monotonic()
                    h.waits.append(got - asked)
                    await asyncio.sleep(HOLD_S)
                    h.holds.append(time.monotonic() - got)
            except TimeoutError:
                h.timeouts += 1
            if loop_for_s is None or time.monotonic() >= stop_at:
                return

    await asyncio.gather(*(caller(i) for i in range(CALLERS)))
    return h


def coordinator_slot(coord: MemoryCoordinator) -> Slot:
    class _Slot:
        def __init__(self, i: int) -> None:
            self.resources = [GLOBAL_RESOURCE, SPACE_PREFIX + "alpha", f"{CONSUMER_PREFIX}{i}"]
            self.lease: Any = None

        async def __aenter__(self) -> None:
            from pool import BusyError

            try:
                self.lease = await coord.acquire(self.resources, timeout=ACQUIRE_TIMEOUT_S)
            except BusyError as exc:
                raise TimeoutError from exc

        async def __aexit__(self, *exc: object) -> None:
            await coord.release(self.lease)

    return _Slot


def limiter_slot(limiter: anyio.CapacityLimiter) -> Slot:
    class _Slot:
        def __init__(self, i: int) -> None:
            pass

        async def __aenter__(self) -> None:
            with anyio.fail_after(ACQUIRE_TIMEOUT_S):
                await limiter.acquire()

        async def __aexit__(self, *exc: object) -> None:
            limiter.release()

    return _Slot


async def fairness_rows(*, once_rounds: int, loop_rounds: int, loop_s: float) -> list[Result]:
    results: list[Result] = []
    for mode, rounds in (("once", once_rounds), ("loop", loop_rounds)):
        if rounds <= 0:
            continue
        loop_for = loop_s if mode == "loop" else None
        runs: dict[str, list[_Harness]] = {"ours": [], "limiter": []}
        for r in range(rounds):
            order = ["ours", "limiter"] if r % 2 == 0 else ["limiter", "ours"]
            for name in order:
                if name == "ours":
                    coord = MemoryCoordinator()
                    await coord.set_limits(
                        {GLOBAL_RESOURCE: CAP, SPACE_PREFIX + "alpha": 50, CONSUMER_PREFIX: 2}
                    )
                    runs[name].append(
                        await run_harness(coordinator_slot(coord), loop_for_s=loop_for)
                    )
                    await coord.aclose()
                else:
                    limiter = anyio.CapacityLimiter(CAP)
                    runs[name].append(await run_harness(limiter_slot(limiter), loop_for_s=loop_for))
        max_wait = {k: [max(h.waits, default=math.nan) for h in v] for k, v in runs.items()}
        timeouts = sum(h.timeouts for h in runs["ours"])
        share = Summary.of([w / IDEAL_MAX_WAIT_S for w in max_wait["ours"]])
        hold = Summary.of([sum(h.holds) / max(1, len(h.holds)) * 1000 for h in runs["ours"]])
        acquisitions = sum(len(h.waits) for h in runs["ours"])
        label = (
            "each caller acquires once"
            if mode == "once"
            else f"each caller loops {loop_s:g} s (asyncpg's program)"
        )
        results.append(
            Result(
                "fairness",
                f"fairness ({mode}): max wait, 100 callers, cap 10, 200 ms holds",
                "s",
                Summary.of(max_wait["ours"]),
                "coordinator (memory)",
                Summary.of(max_wait["limiter"]),
                "anyio.CapacityLimiter",
                ratio=share,
                goal=f"no timeouts; max wait ≤ 1.2 × {IDEAL_MAX_WAIT_S:.1f} s",
                met=timeouts == 0 and share.median <= 1.2,
                note=(
                    f"{label}; {rounds} rounds, {acquisitions} acquisitions, "
                    f"{timeouts} timeouts (limiter: {sum(h.timeouts for h in runs['limiter'])}); "
                    f"ratio = max wait / ideal {IDEAL_MAX_WAIT_S:.1f} s; mean hold "
                    f"{hold.median:.0f} ms (timer overshoot stretches every wait)"
                ),
                detail={
                    "max_wait_s": max_wait,
                    "timeouts": {k: [h.timeouts for h in v] for k, v in runs.items()},
                    "mean_hold_ms": hold.median,
                },
            )
        )
    return results
