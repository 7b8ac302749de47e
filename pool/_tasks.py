"""Background tasks that end when told to, for sure."""

from __future__ import annotations

import asyncio
from typing import Any

RECANCEL_S = 0.5  # how often a task that is still running is cancelled again


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks``; return once every one has ended, cancelling again every
    :data:`RECANCEL_S` the ones still running. Their outcomes are not raised.

    A cancellation can be lost on its way: Python 3.11's ``asyncio.wait_for`` drops one
    that races the result it awaits (cpython gh-86296), one that lands as an
    ``asyncio.timeout`` expires surfaces as ``TimeoutError`` (an ``OSError``, which store
    and HTTP loops treat as "unreachable, try again"), and an anyio scope shielded from
    cancellation (httpcore closes a response in one) absorbs one. A loop that lost its
    cancel runs on, and an owner awaiting it once would wait forever (seen: a pool's
    close still waiting after 120 s, its loop waking every 0.5 s).
    """
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" at exit
