"""Work counted, not only timed (issue 39): the entries one admission operation touches
stay within a constant from 1 to 10,000 waiters and from 1 to 1,000 Spaces.

The memory store counts the entries of its grant index it touches
(``MemoryCoordinator.work``); the SQLite store counts the virtual-machine steps of its
statements (``SQLiteCoordinator.work``, SQLite's progress handler). Each test builds
the same scene small and large and compares one operation's count.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from pool.admission import CONSUMER_PREFIX, Lease, WaitTicket
from pool.admission._memory import MemoryCoordinator

from .helpers import GLOBAL, settle, until

SIZES = [(1, 1), (10_000, 1_000)]  # (waiters parked, Spaces)


@dataclass
class Scene:
    """Spaces all held (limit 1 each), waiters parked over them, a consumer's backlog."""

    coord: MemoryCoordinator
    holders: dict[str, Lease] = field(default_factory=dict)
    parked: list[asyncio.Task[Lease]] = field(default_factory=list)


async def build(waiters: int, spaces: int, backlog: int) -> Scene:
    coord = MemoryCoordinator()
    await coord.set_limits({GLOBAL: spaces + 100, "space:": 1, "space:backlog": 10,
                            CONSUMER_PREFIX: 1})  # fmt: skip
    scene = Scene(coord)
    for i in range(spaces):
        scene.holders[f"space:s{i}"] = await coord.acquire([GLOBAL, f"space:s{i}"], timeout=0)
    await coord.acquire([GLOBAL, "space:backlog", CONSUMER_PREFIX + "x"], timeout=0)
    tickets: list[WaitTicket] = []
    for i in range(waiters + backlog):
        ticket = WaitTicket()
        tickets.append(ticket)
        resources = ([GLOBAL, f"space:s{i % spaces}"] if i < waiters
                     else [GLOBAL, "space:backlog", CONSUMER_PREFIX + "x"])  # fmt: skip
        scene.parked.append(asyncio.create_task(coord.acquire(resources, timeout=600,
                                                              ticket=ticket)))  # fmt: skip
    await until(lambda: all(t.position for t in tickets), timeout=60, what="all queued")
    return scene


async def cost(coord: MemoryCoordinator, operation: Callable[[], Awaitable[object]]) -> int:
    before = coord.work
    await operation()
    return coord.work - before


async def measure(waiters: int, spaces: int, backlog: int) -> dict[str, int]:
    scene = await build(waiters, spaces, backlog)
    coord, counts = scene.coord, {}
    try:

        async def cycle() -> None:
            await coord.release(await coord.acquire([GLOBAL, "space:free"], timeout=0))

        async def other_consumer() -> None:
            lease = await coord.acquire([GLOBAL, "space:backlog", CONSUMER_PREFIX + "y"],
                                        timeout=0)  # fmt: skip
            await coord.release(lease)

        async def hand_off() -> None:
            await coord.release(scene.holders["space:s0"])

        async def cancel() -> None:
            task = scene.parked[len(scene.parked) // 2]
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        counts["cycle"] = await cost(coord, cycle)
        counts["other consumer"] = await cost(coord, other_consumer)
        counts["enqueue"] = await cost(coord, lambda: _enqueue(coord, scene))
        counts["cancel"] = await cost(coord, cancel)
        counts["hand-off"] = await cost(coord, hand_off)
        return counts
    finally:
        for task in scene.parked:
            task.cancel()
        await asyncio.gather(*scene.parked, return_exceptions=True)
        await coord.aclose()


async def _enqueue(coord: MemoryCoordinator, scene: Scene) -> None:
    ticket = WaitTicket()
    scene.parked.append(
        asyncio.create_task(coord.acquire([GLOBAL, "space:s0"], timeout=600, ticket=ticket))
    )
    await until(lambda: ticket.position > 0, what="queued")
    await settle()


@pytest.mark.parametrize("backlog", [0, 10_000])
async def test_memory_operations_touch_the_same_entries_at_fleet_scale(backlog: int) -> None:
    """Memory store: each operation touches as many index entries with 10,000 waiters
    over 1,000 Spaces (and a 10,000-call backlog) as with 1 waiter on 1 Space."""
    small = await measure(*SIZES[0], backlog=0)
    large = await measure(*SIZES[1], backlog=backlog)
    print(f"memory, backlog {backlog}: 1 waiter/1 Space {small}; 10,000/1,000 {large}")
    for name, count in small.items():
        assert large[name] <= count + 4, f"{name}: {count} entries grew to {large[name]}"
