"""Waiting for threads to end, from the event loop, without blocking it.

``Thread.join`` blocks, and running it in a thread would need a thread (the loop's
default executor, which would then outlive the pool). Threads that are about to end
are polled instead: every few milliseconds, within a bound.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

_POLL_S = 0.005


async def wait_ended(
    threads: Iterable[threading.Thread], timeout_s: float
) -> list[threading.Thread]:
    """Return once every thread has ended or ``timeout_s`` passed; the ones still alive."""
    alive = [t for t in threads if t.is_alive()]
    deadline = time.monotonic() + timeout_s
    while alive and time.monotonic() < deadline:
        await asyncio.sleep(_POLL_S)
        alive = [t for t in alive if t.is_alive()]
    return alive


async def shutdown_executor(
    executor: ThreadPoolExecutor, timeout_s: float
) -> list[threading.Thread]:
    """``shutdown`` (queued work cancelled) and wait for its threads; those still alive."""
    executor.shutdown(wait=False, cancel_futures=True)
    return await wait_ended(list(getattr(executor, "_threads", ())), timeout_s)
