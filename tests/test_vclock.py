"""The tests' virtual clock (tests/_vclock.py): jumps over idle sleeps, never over real work."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests._vclock import VirtualClock


async def test_a_long_sleep_passes_at_once_in_virtual_time() -> None:
    """A 60 s sleep with nothing else going on ends within a second, 60 s later."""
    clock = VirtualClock()
    real, virtual = time.monotonic(), clock.now()
    await clock.sleep(60)
    assert clock.now() - virtual >= 60
    assert time.monotonic() - real < 1
    assert clock.jumps == 1 and clock.sleepers == 0


async def test_sleepers_wake_in_order_of_their_wake_up_times() -> None:
    """Concurrent sleeps of 3, 1 and 2 s wake 1, 2, 3, each at its own virtual time."""
    clock = VirtualClock()
    start = clock.now()
    woke: list[tuple[int, float]] = []

    async def nap(seconds: int) -> None:
        await clock.sleep(seconds)
        woke.append((seconds, clock.now() - start))

    await asyncio.gather(nap(3), nap(1), nap(2))
    assert [s for s, _ in woke] == [1, 2, 3]
    assert all(s <= at < s + 0.5 for s, at in woke), woke


async def test_an_open_timeout_holds_the_clock_for_real_work() -> None:
    """While a timeout block waits on real work (0.3 s), a 10 s sleeper is not woken by a
    jump and the timeout does not fire; the sleeper wakes once the block has closed."""
    clock = VirtualClock()
    sleeper = asyncio.create_task(clock.sleep(10))
    began = clock.now()
    async with clock.timeout(1.0):
        await asyncio.sleep(0.3)  # real work: a gradio call, say
        assert not sleeper.done(), "the clock jumped while real work was in flight"
    assert clock.now() - began < 1.0
    assert clock.jumps == 0
    await asyncio.wait_for(sleeper, 1)
    assert clock.now() - began >= 10


async def test_real_work_is_never_cut_short_by_jumps_elsewhere() -> None:
    """A task ticking every 0.1 s virtual runs beside a 0.2 s real wait under a 0.5 s
    timeout: the wait completes, and virtual time covers at least the real time."""
    clock = VirtualClock()
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            await clock.sleep(0.1)

    ticking = asyncio.create_task(ticker())
    try:
        await asyncio.sleep(0.05)  # let it jump a few times
        assert clock.jumps > 0
        virtual = clock.now()  # read first, and last below: it spans the real reads
        real = time.monotonic()
        async with clock.timeout(0.5):
            await asyncio.sleep(0.2)
        took_real = time.monotonic() - real
        took_virtual = clock.now() - virtual
        assert took_virtual >= took_real >= 0.2
    finally:
        stop.set()
        await ticking


async def test_advance_fires_timeouts_on_the_same_time_line_as_sleeps() -> None:
    """Without autojump, advance(5) ends a 5 s sleep and a 5 s timeout begun together,
    and not a 6 s one."""
    clock = VirtualClock(autojump=False)
    outcome: dict[str, float] = {}
    start = clock.now()

    async def sleep(seconds: float) -> None:
        await clock.sleep(seconds)
        outcome[f"sleep {seconds}"] = clock.now() - start

    async def time_out(seconds: float) -> None:
        with pytest.raises(TimeoutError):
            async with clock.timeout(seconds):
                await asyncio.Event().wait()
        outcome[f"timeout {seconds}"] = clock.now() - start

    tasks = [asyncio.create_task(c) for c in (sleep(5), time_out(5), time_out(6))]
    await asyncio.sleep(0)
    await clock.advance(5)
    assert set(outcome) == {"sleep 5", "timeout 5"}, outcome
    assert all(5 <= at < 5.5 for at in outcome.values()), outcome
    await clock.advance(1)
    assert "timeout 6" in outcome
    await asyncio.gather(*tasks)


async def test_hold_keeps_virtual_time_at_real_speed() -> None:
    """Inside ``hold()`` a sleeper is woken by real time only."""
    clock = VirtualClock()
    with clock.hold():
        task = asyncio.create_task(clock.sleep(0.2))
        await asyncio.sleep(0.1)
        assert not task.done() and clock.jumps == 0
        await asyncio.wait_for(task, 1)
    assert clock.jumps == 0
