"""Row "queue": what one hand-off costs when many waiters are queued, per store.

A store's grant pass used to run the rule over every waiter (and refresh every
waiter's ticket) on each acquire and release, so a hand-off cost O(waiters). Here
``CAP`` leases are held on ``backend:global`` (the pool's resources: global, a Space,
a consumer), ``N`` waiters queue behind them, and each step releases the oldest
lease and queues one newcomer, so the queue keeps its length. The figure is the
median wall time of one step (release, the hand-off to the head waiter, one
arrival) with ``N`` = 500 against the same with ``N`` = 10, in one process;
rounds alternate the two sizes. For the shared stores a step includes their round
trips. The note also gives the time ``N`` arrivals at once took to queue.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from _bench_stats import Result, Summary, ratios
from _bench_stores import _drop_prefixes, redis_url

from pool.admission import GLOBAL_RESOURCE, Coordinator, Lease, WaitTicket, open_coordinator

CAP = 10
SIZES = (10, 500)


def _resources(i: int) -> list[str]:
    return [GLOBAL_RESOURCE, f"space:s{i % 3}", f"consumer:u{i}"]


def _arrive(coord: Coordinator, i: int) -> tuple[asyncio.Task[Lease], WaitTicket]:
    ticket = WaitTicket()
    return asyncio.create_task(coord.acquire(_resources(i), timeout=600, ticket=ticket)), ticket


async def _until(check: Callable[[], bool]) -> None:
    """Wait for ``check()``: bare yields for about a round trip (timer sleeps would add
    the loop's 1 ms timer resolution to every step), then short sleeps. One waiter at
    a time: 500 tasks busy-yielding at once starved the SQLite store's worker thread
    of the GIL (its heartbeat stalled past the lease TTL in one full run)."""
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0)
    while not check():
        await asyncio.sleep(0.0002)


async def _in_line(task: asyncio.Task[Any], ticket: WaitTicket) -> None:
    """Return once ``task``'s waiter is queued (its ticket shows a position) or granted:
    woken by the ticket's own change and the task's end, never by polling. A busy wait
    here (``_until``) took the GIL from the SQLite store's worker thread after each of
    its statements, so the enqueue row measured that contest (0.7-1.0 ms per enqueue on
    a quiet machine, 0.2 ms loaded) rather than the queue."""
    await asyncio.sleep(0)  # the task's first step: the memory store queues it there
    while not (task.done() or ticket.position > 0):
        changed = asyncio.ensure_future(ticket.changed())
        try:
            await asyncio.wait((task, changed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()


async def _queued(coord: Coordinator, i: int) -> asyncio.Task[Lease]:
    task, ticket = _arrive(coord, i)
    await _in_line(task, ticket)
    return task


async def measure(url: str, waiters: int, steps: int) -> tuple[float, float]:
    """(median seconds per step, seconds for ``waiters`` arrivals at once)."""
    coord = open_coordinator(url, lease_ttl_s=60)
    tasks: list[asyncio.Task[Lease]] = []
    try:
        await coord.set_limits({GLOBAL_RESOURCE: CAP, "space:": 50, "consumer:": 2})
        held = [await coord.acquire(_resources(i), timeout=60) for i in range(CAP)]
        started = time.perf_counter()
        arrived = [_arrive(coord, CAP + i) for i in range(waiters)]
        tasks = [task for task, _ in arrived]
        await _until(lambda: all(t.done() or ticket.position > 0 for t, ticket in arrived))
        arrivals = time.perf_counter() - started
        seq = CAP + waiters
        costs: list[float] = []
        for _ in range(steps):
            t = time.perf_counter()
            await coord.release(held.pop(0))
            tasks.append(await _queued(coord, seq))
            costs.append(time.perf_counter() - t)
            seq += 1
            # the hand-off reaches its task (not timed)
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in [task for task in tasks if task.done()]:
                tasks.remove(task)
                held.append(task.result())
        for lease in held:
            await coord.release(lease)
        return statistics.median(costs), arrivals
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await coord.aclose()


async def queue_rows(*, rounds: int, steps: int) -> list[Result]:
    import bench_admission as ba

    stores = {"memory": "memory://", "SQLite": "sqlite"}
    if ba.redis_reachable(redis_url()):
        stores["Redis"] = "redis"
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, kind in stores.items():
            cost: dict[int, list[float]] = {n: [] for n in SIZES}
            arrive: list[float] = []
            prefixes: list[str] = []
            for r in range(rounds):
                for n in SIZES if r % 2 == 0 else SIZES[::-1]:
                    tag = uuid.uuid4().hex[:8]
                    if kind == "sqlite":
                        url = f"sqlite:///{os.path.join(tmp, tag)}.db"
                    elif kind == "redis":
                        prefixes.append(f"spacepool-bench-{tag}:")
                        url = f"{redis_url()}?prefix={prefixes[-1]}"
                    else:
                        url = kind
                    step_s, arrivals_s = await measure(url, n, steps)
                    cost[n].append(1000 * step_s)
                    if n == SIZES[-1]:
                        arrive.append(arrivals_s)
            if prefixes:
                _drop_prefixes(redis_url(), prefixes)
            long, short = cost[SIZES[-1]], cost[SIZES[0]]
            results.append(
                Result(
                    "queue",
                    f"queue: hand-off + arrival, {SIZES[-1]} waiters, {name} store",
                    "ms",
                    Summary.of(long),
                    f"{SIZES[-1]} waiters",
                    Summary.of(short),
                    f"{SIZES[0]} waiters",
                    ratio=Summary.of(ratios(long, short)),
                    goal="reported (flat in the queue length)",
                    met=None,
                    note=(
                        f"{rounds} rounds × {steps} steps per size, cap {CAP} held on "
                        f"{GLOBAL_RESOURCE}; {SIZES[-1]} arrivals at once queued in "
                        f"{statistics.median(arrive):.2f} s (median)"
                    ),
                    detail={"step_ms": {str(n): cost[n] for n in SIZES}, "arrivals_s": arrive},
                )
            )
    return results
