"""The pool's one clock: every sleep, deadline and timestamp in ``pool/`` reads it.

``now()`` is monotonic seconds (intervals, deadlines, cool-downs); ``wall()`` is epoch
seconds, the only clock several hosts share (the health board's records); ``sleep``
and ``timeout`` wait on the same time line as ``now()``. :class:`Clock` is real time;
tests inject a virtual one so that cool-downs and wake deadlines pass without waiting.

Not on this clock, on purpose: admission leases (their store's TTL runs on real time,
so a lease's local expiry must too) and waits for OS threads to end.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AbstractAsyncContextManager


class Clock:
    """Real time."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[object]:
        """Like ``asyncio.timeout(seconds)`` (None: no bound), on this clock."""
        return asyncio.timeout(None if seconds is None else max(0.0, seconds))


SYSTEM_CLOCK = Clock()
