"""Small async helpers shared by the admission tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from pool.admission import Coordinator, Lease, WaitTicket

GLOBAL = "backend:global"


async def until(check: Callable[[], bool], *, timeout: float = 5.0, what: str = "it") -> None:
    """Yield to the loop until ``check()`` holds (bounded: fail after ``timeout``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    spins = 0
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        spins += 1
        await asyncio.sleep(0 if spins < 50 else 0.002)


async def until_async(
    check: Callable[[], Awaitable[bool]], *, timeout: float = 5.0, what: str = "it"
) -> None:
    """Like :func:`until` for a check that needs I/O (a snapshot of another process)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


async def queue(
    coord: Coordinator, resources: Sequence[str], *, timeout: float = 30.0
) -> tuple[asyncio.Task[Lease], WaitTicket]:
    """Start an acquire and return once it is queued in the store (or already granted)."""
    ticket = WaitTicket()
    task = asyncio.create_task(coord.acquire(resources, timeout=timeout, ticket=ticket))
    await until(lambda: ticket.position > 0 or task.done(), what="the waiter to be queued")
    return task, ticket


async def settle() -> None:
    """Let woken tasks run, so every grant already made has reached its task."""
    for _ in range(20):
        await asyncio.sleep(0)
