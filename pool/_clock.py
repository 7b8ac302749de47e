"""The pool's one clock: every sleep, deadline and timestamp in ``pool/`` reads it.

``now()`` is monotonic seconds (intervals, deadlines, cool-downs); ``wall()`` is epoch
seconds, the only clock several hosts share (the health board's records); ``sleep``
and ``timeout`` wait on the same time line as ``now()``. :class:`Clock` is real time;
tests inject a virtual one so that cool-downs and wake deadlines pass without waiting.

A wait of the request path on a Space (routing, a connect, a call, fetching its files)
or on a release is always inside ``timeout`` — ``timeout(None)`` when it has no bound —
so a virtual clock can tell real work in flight (which it must not skip over) from
idle sleeps.

Not on this clock, on purpose — each is a wait for something outside the pool's time
line, which a virtual clock must not cut short:

* admission (``pool/admission``): leases, their renewals and the stores' TTLs run on
  real time (the store's TTL does, so a lease's local expiry must too);
* waits for OS threads: :func:`pool._threads.wait_ended`, a closing connection's wait
  for its job cancels and threads, a returned connection's wait for gradio_client's
  thread to close its result stream (``SpacePool._settle``), and the cancel that
  waits, in a worker thread, for the Space to name a job (``_quiet_cancel``);
* timeouts inside I/O libraries (httpx's connect/read timeouts).
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
