"""Background loops end at their first cancel, even when it surfaces as an error.

A loop that must outlive every error of a store or a Space (``errors_ignored``) used to
swallow its own cancel when a library turned it into an error of its own, and ran on
until ``cancel_and_wait`` cancelled it again after ``FIRST_WAIT_S`` (a pool's close took
5.04 s in a CI run, its maintenance loop on a Redis store)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from pool._tasks import cancel_and_wait, cancelling, errors_ignored


async def _a_call_that_turns_its_cancel_into_an_error() -> None:
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        raise ConnectionError("connection closed") from None


async def _closed_within(task: asyncio.Task[None]) -> float:
    started = time.monotonic()
    await cancel_and_wait(task)
    return time.monotonic() - started


async def test_an_error_raised_by_the_cancel_ends_the_loop_at_once() -> None:
    turns = 0

    async def loop() -> None:
        nonlocal turns
        while True:
            turns += 1
            with errors_ignored():
                await _a_call_that_turns_its_cancel_into_an_error()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.05)
    assert await _closed_within(task) < 1.0
    assert task.cancelled() and turns == 1


async def test_other_errors_are_ignored_and_the_loop_goes_on() -> None:
    turns = 0

    async def loop() -> None:
        nonlocal turns
        while turns < 3:
            turns += 1
            with errors_ignored():
                raise ConnectionError("the store is down")
            await asyncio.sleep(0)

    await asyncio.wait_for(loop(), 1.0)
    assert turns == 3


async def test_a_loop_that_asks_ends_even_when_the_cancel_was_swallowed() -> None:
    """``cancelling()`` stays true once the cancel is swallowed by any code: a loop that
    asks at each turn ends at its next turn, not at the second cancel."""

    async def loop() -> None:
        while not cancelling():
            with contextlib.suppress(Exception):  # not errors_ignored: the cancel is lost
                await _a_call_that_turns_its_cancel_into_an_error()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.05)
    assert await _closed_within(task) < 1.0


async def test_plain_suppress_loses_the_cancel_until_the_second() -> None:
    """What the tests above guard against, shown: ``suppress(Exception)`` in a loop that
    does not ask runs on after its first cancel (until ``cancel_and_wait`` cancels it
    again, ``FIRST_WAIT_S`` later)."""
    ran_on = asyncio.Event()

    async def loop() -> None:
        while True:
            with contextlib.suppress(Exception):
                await _a_call_that_turns_its_cancel_into_an_error()
            ran_on.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.05)
    closing = asyncio.create_task(cancel_and_wait(task))
    await asyncio.wait_for(ran_on.wait(), 1.0)
    assert not task.done() and not closing.done()
    task.cancel()  # the second cancel, without waiting FIRST_WAIT_S for it
    await asyncio.wait_for(closing, 1.0)
    assert task.cancelled()
