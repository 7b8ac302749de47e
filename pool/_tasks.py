"""Background tasks that end when told to, for sure."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

_log = logging.getLogger("spacepool")

FIRST_WAIT_S = 5.0  # a task's own cleanup after the first cancel, before any other
RECANCEL_S = 1.0  # then, how often a task that is still running is cancelled again


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks``; return once every one has ended, cancelling again the ones still
    running after :data:`FIRST_WAIT_S` (time for their own cleanup: closing a response
    or a connection must not be cut short), then every :data:`RECANCEL_S`. Their
    outcomes are not raised.

    A cancellation can be lost on its way: Python 3.11's ``asyncio.wait_for`` drops one
    that races the result it awaits (cpython gh-86296), one that lands as an
    ``asyncio.timeout`` expires surfaces as ``TimeoutError`` (an ``OSError``, which store
    and HTTP loops treat as "unreachable, try again"), and an anyio scope shielded from
    cancellation (httpcore closes a response in one) absorbs one. A loop that lost its
    cancel runs on, and an owner awaiting it once would wait forever (seen: a pool's
    close still waiting after 120 s, its loop waking every 0.5 s).
    """
    pending = {task for task in tasks if not task.done()}
    wait_s = FIRST_WAIT_S
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=wait_s)
        wait_s = RECANCEL_S
        for task in pending:
            _log.warning("a task ran on after its cancel; cancelling it again: %r", task)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" at exit


@contextlib.contextmanager
def errors_ignored() -> Iterator[None]:
    """``contextlib.suppress(Exception)`` for a background loop that must outlive any
    error, but not its own cancel: while the task is being cancelled, an error is how the
    cancel surfaced (a library that turns it into its own error, a store that reports it
    as "unreachable"), and it is raised as the cancel. Swallowed, the loop ran on and its
    owner's close waited :data:`FIRST_WAIT_S` for the second cancel (seen: a pool's close
    taking 5.04 s on its maintenance loop, redis store)."""
    try:
        yield
    except Exception as exc:
        if cancelling():
            raise asyncio.CancelledError from exc


def cancelling() -> bool:
    """Whether the current task has been told to stop (a cancel not withdrawn), though
    the cancel may have been swallowed on its way: a loop asks at each turn."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
