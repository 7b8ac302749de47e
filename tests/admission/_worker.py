"""A separate process for the cross-process tests: ``python -m tests.admission._worker``.

``hammer URL OUT``: print ``ready``, wait for ``go`` on stdin, then run 4 tasks that
acquire and release for ``SECONDS`` and write each hold interval (monotonic ns, which
on Linux is one clock for every process) to ``OUT`` as JSON.

``hold URL N``: take ``N`` leases of ``backend:global``, queue one more request on
``space:blocked``, print ``holding`` and wait to be killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
import types
from pathlib import Path

# Load pool.admission without running pool/__init__.py, which imports gradio_client
# and friends: the worker then starts in ~0.4 s instead of ~1 s of CPU.
_package = types.ModuleType("pool")
_package.__path__ = [str(Path(__file__).resolve().parents[2] / "pool")]
sys.modules.setdefault("pool", _package)

from pool.admission import GLOBAL_RESOURCE, WaitTicket, open_coordinator  # noqa: E402

SECONDS = 1.5
LEASE_TTL_S = 1.0  # the holder a test kills: its slots come back within this + 1 s
# The hammer's TTL matters only if a renewal is late: four processes under the suite's
# load (a load average of ~13 on 2 cores) once missed a 1 s TTL's renewal budget.
HAMMER_TTL_S = 3.0


async def hammer(url: str) -> list[tuple[list[str], int, int]]:
    coord = open_coordinator(url, lease_ttl_s=HAMMER_TTL_S)
    await coord.snapshot()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    intervals: list[tuple[list[str], int, int]] = []
    deadline = time.monotonic() + SECONDS

    async def task(n: int) -> None:
        consumer = f"consumer:{os.getpid()}-{n % 2}"
        while time.monotonic() < deadline:
            resources = [GLOBAL_RESOURCE, random.choice(["space:a", "space:b"]), consumer]
            lease = await coord.acquire(resources, timeout=30)
            start = time.monotonic_ns()
            await asyncio.sleep(random.random() * 0.002)
            intervals.append((resources, start, time.monotonic_ns()))
            await coord.release(lease)

    await asyncio.gather(*(task(n) for n in range(4)))
    await coord.aclose()
    return intervals


async def hold(url: str, count: int) -> None:
    coord = open_coordinator(url, lease_ttl_s=LEASE_TTL_S)
    for _ in range(count):
        await coord.acquire([GLOBAL_RESOURCE], timeout=5)
    ticket = WaitTicket()
    waiter = asyncio.ensure_future(coord.acquire(["space:blocked"], timeout=600, ticket=ticket))
    while ticket.position == 0:
        await asyncio.sleep(0.01)
    print("holding", flush=True)
    await waiter


if __name__ == "__main__":
    mode, url, arg = sys.argv[1:4]
    if mode == "hammer":
        Path(arg).write_text(json.dumps(asyncio.run(hammer(url))))
    else:
        asyncio.run(hold(url, int(arg)))
