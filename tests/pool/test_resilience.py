"""Resilience against real stand-in Spaces: window, breaker, retries, waking, idle pause.

Cool-downs, wake deadlines and idle periods pass on a virtual clock (tests/_vclock.py):
the Spaces and the calls to them are real and take real time, the waits between do not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from devspaces import SpaceFleet, SpaceProcess, free_port
from pool import (
    DeadlineExceeded,
    NoHealthySpaceError,
    Pool,
    PoolEvent,
    PoolSettings,
    UpstreamTransportError,
    WaitTicket,
)
from pool.resilience import FakeSpaceControl
from tests._vclock import VirtualClock
from tests.conftest import PoolMaker
from tests.pool.test_core import wait_until

FAST_FAIL = {
    "breaker_failures": 3,
    "breaker_cooldown_s": 1.5,
    "retry_attempts": 2,
    "retry_backoff_s": 0.01,
    "min_connections": 1,
}


async def test_queue_full_space_is_backed_off_broken_and_recovers(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """Every call to alpha is "queue full": its window halves to 1, its breaker opens,
    traffic moves to beta; once alpha recovers and the 30 s cool-down has passed (not
    before) the probe closes the breaker and the window climbs again."""
    clock = VirtualClock(autojump=False)  # only the test moves time past real time
    pool = make_pool(clean_fleet, clock=clock, **{**FAST_FAIL, "breaker_cooldown_s": 30.0})
    await pool.start()
    alpha = clean_fleet["alpha"]
    alpha.control(mode="queue_full")
    trace: list[tuple[str, int, str]] = []

    def note(step: str) -> None:
        h = pool.board.get("alpha")
        trace.append((step, h.window, h.breaker))

    note("start")
    served = []
    for i in range(8):
        done = await pool.predict("/echo", f"r{i}", 0)
        served.append(done.space)
        note(f"req{i}:{done.space}")
    print("window trace (failing):", trace)
    windows = [w for _, w, _ in trace]
    assert windows[0] == 4 and 2 in windows and windows[-1] == 1
    assert pool.board.get("alpha").breaker == "open"
    assert set(served) == {"beta"}, "every request was served by the healthy Space"
    refused = alpha.stats().refused
    assert refused == 3, "alpha was called until its breaker opened, then left alone"
    stats = await pool.stats()
    assert stats["pools"]["alpha"]["breaker"]["state"] == "open"
    assert stats["pools"]["alpha"]["window"]["current"] == 1
    assert stats["admission"]["globalInUse"] == 0

    alpha.control(mode="ok")
    assert not pool.board.get("alpha").probe_due(clock.wall()), "still cooling down"
    await clock.advance(20)
    assert not pool.board.get("alpha").probe_due(clock.wall()), "still cooling down"
    assert (await pool.predict("/echo", "early", 0)).space == "beta"
    await clock.advance(10)
    assert pool.board.get("alpha").probe_due(clock.wall())
    assert alpha.stats().refused == refused and alpha.stats().total == 0
    probe = await pool.predict("/echo", "probe", 0)
    note(f"probe:{probe.space}")
    assert probe.space == "alpha" and pool.board.get("alpha").breaker == "closed"
    for i in range(9):
        await pool.predict("/echo", f"up{i}", 0, space="alpha")
        note(f"up{i}")
    print("window trace (recovering):", trace[-10:])
    assert pool.board.get("alpha").window == 4, "1 after the probe, +1 per 3 successes"
    assert pool.board.get("alpha").peak == 4


async def test_a_full_space_queue_is_waited_out_until_the_queue_timeout(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """A request pinned to a queue-full Space is not failed at ``retry_attempts``: each
    refusal puts it back in the pool's queue, until its queue timeout; then the refusal."""
    pool = make_pool(clean_fleet, retry_attempts=2, retry_backoff_s=0.01, breaker_failures=50)
    events: list[PoolEvent] = []
    pool.hooks.append(events.append)
    await pool.start()
    clean_fleet["alpha"].control(mode="queue_full")
    started = time.monotonic()
    with pytest.raises(UpstreamTransportError) as info:
        await pool.predict("/echo", "x", 0, space="alpha", queue_timeout_s=1.0)
    took = time.monotonic() - started
    assert info.value.kind == "queue_full" and info.value.before_accept
    refused = clean_fleet["alpha"].stats().refused
    assert refused > 2, "waited again past retry_attempts"
    assert 0.5 <= took < 4.0, f"ended by the queue timeout (1 s), took {took:.2f} s"
    assert {e.outcome for e in events if e.kind == "retry"} == {"queue_full"}
    assert (await pool.stats())["admission"]["globalInUse"] == 0


async def test_caller_errors_do_not_move_the_window(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """An app error (the Space raised on bad input) is the caller's: window and breaker
    stay put, and nothing is retried."""
    pool = make_pool(clean_fleet, **FAST_FAIL)
    await pool.start()
    for _ in range(5):
        with pytest.raises(Exception, match="failed: bad"):
            await pool.predict("/fail", "bad", space="alpha")
    h = pool.board.get("alpha")
    assert (h.window, h.failures, h.breaker) == (4, 0, "closed")


async def test_open_breaker_on_a_pinned_space_is_a_busy_answer(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """A request naming a Space whose breaker is open gets NoHealthySpaceError with a
    retry-after of the remaining cool-down; nothing is sent."""
    pool = make_pool(clean_fleet, **{**FAST_FAIL, "breaker_cooldown_s": 20.0, "retry_attempts": 1})
    clean_fleet["alpha"].control(mode="queue_full")
    with pytest.raises(NoHealthySpaceError):  # refused until the breaker opened
        await pool.predict("/echo", "x", 0, space="alpha")
    assert pool.board.get("alpha").breaker == "open"
    refused = clean_fleet["alpha"].stats().refused
    with pytest.raises(NoHealthySpaceError) as info:
        await pool.predict("/echo", "x", 0, space="alpha")
    assert 10 <= info.value.retry_after_s <= 20
    assert clean_fleet["alpha"].stats().refused == refused


async def test_deadline_counts_as_a_provider_timeout(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """A predict that outlives its deadline is cancelled upstream, frees its slot at
    once, and halves the window (the Space did not answer in time)."""
    pool = make_pool(clean_fleet, retry_attempts=1)
    await pool.start()
    alpha = clean_fleet["alpha"]
    started = time.monotonic()
    with pytest.raises(Exception, match="deadline"):
        await pool.predict("/echo", "slow", 30, space="alpha", timeout=1.0)
    assert time.monotonic() - started < 3
    assert (await pool.stats())["admission"]["globalInUse"] == 0
    await wait_until(lambda: alpha.stats().in_flight == 0, 5)
    assert pool.board.get("alpha").window == 2


def _sleeping_space(name: str) -> tuple[str, int]:
    port = free_port()
    return f"{name}=http://127.0.0.1:{port}/", port


def boot_on_wake(
    name: str,
    port: int,
    delay_s: float,
    clock: VirtualClock,
    booted: list[SpaceProcess],
    boots: list[asyncio.Task[None]],
) -> Callable[[str], None]:
    """An ``on_wake`` for FakeSpaceControl: start the stand-in ``delay_s`` after the wake
    on ``clock``; the clock is held while the process boots (real work, real time)."""

    async def boot() -> None:
        await clock.sleep(delay_s)
        with clock.hold():
            space = SpaceProcess(name, port=port, wait=False)
            booted.append(space)
            await asyncio.to_thread(space.wait_ready)

    def boot_later(_name: str) -> None:
        boots.append(asyncio.get_running_loop().create_task(boot()))

    return boot_later


async def _watch_ticket(ticket: WaitTicket, seen: set[str], stop: asyncio.Event) -> None:
    while not stop.is_set():
        seen.add(ticket.stage)
        await asyncio.sleep(0.05)


async def test_sleeping_space_is_woken_and_used_within_its_wake_deadline(
    clean_fleet: SpaceFleet,
) -> None:
    """A Space reported SLEEPING whose process starts 20 s after the wake request is
    used without failover inside a 60 s wake deadline; meanwhile the request shows
    stage ``waking`` and the Space's stats say so."""
    clock = VirtualClock()
    entry, port = _sleeping_space("sleepy")
    started_space: list[SpaceProcess] = []
    boots: list[asyncio.Task[None]] = []
    control = FakeSpaceControl(
        {"sleepy": "SLEEPING"},
        on_wake=boot_on_wake("sleepy", port, 20.0, clock, started_space, boots),
    )
    settings = PoolSettings(
        spaces=f"{entry},{clean_fleet.pool_spaces_env()}",
        coordinator_url="memory://",
        wake_timeout_s=60,
        wake_poll_s=0.5,
        min_connections=1,
    )
    pool = Pool(settings, space_control=control, clock=clock)
    events: list[PoolEvent] = []
    pool.hooks.append(events.append)
    ticket, seen, stop = WaitTicket(), set[str](), asyncio.Event()
    watcher = asyncio.create_task(_watch_ticket(ticket, seen, stop))
    try:
        await pool.start()
        began = clock.now()
        task = asyncio.create_task(pool.predict("/echo", "hi", 0, ticket=ticket, timeout=90))
        await wait_until(lambda: ticket.stage == "waking", 10)
        stats = await pool.stats()
        assert stats["pools"]["sleepy"]["wake"]["state"] == "waking"
        assert stats["pools"]["sleepy"]["wake"]["deadline"] is not None
        done = await asyncio.wait_for(task, 75)
        took = clock.now() - began
        assert done.space == "sleepy" and done.result == "sleepy:hi"
        assert done.attempts == 1, "no failover"
        assert 20 <= took < 60, took
        (awake,) = [e for e in events if e.kind == "wake" and e.outcome == "awake"]
        assert 20 <= awake.seconds < 60, awake
        assert "waking" in seen and ticket.stage == "queued"
        assert control.count("wake", "sleepy") == 1
        assert (await pool.stats())["pools"]["sleepy"]["wake"]["state"] == "awake"
        assert clock.skipped >= 15, "the wait was virtual"
    finally:
        stop.set()
        await watcher
        await pool.aclose()
        for boot in boots:
            boot.cancel()
        await asyncio.gather(*boots, return_exceptions=True)
        for space in started_space:
            space.stop()


async def test_space_that_does_not_wake_in_time_fails_over(clean_fleet: SpaceFleet) -> None:
    """With a 5 s wake deadline a Space that stays asleep is given up after 5 s (not
    before, not much later) and the request is served by another Space."""
    clock = VirtualClock()
    entry, _port = _sleeping_space("sleepy")
    control = FakeSpaceControl({"sleepy": "SLEEPING"})
    settings = PoolSettings(
        spaces=f"{entry},{clean_fleet.pool_spaces_env()}",
        coordinator_url="memory://",
        wake_timeout_s=5,
        wake_poll_s=0.25,
        min_connections=1,
    )
    pool = Pool(settings, space_control=control, clock=clock)
    events: list[PoolEvent] = []
    pool.hooks.append(events.append)
    try:
        await pool.start()
        began = clock.now()
        done = await pool.predict("/echo", "hi", 0, space=None, timeout=30)
        took = clock.now() - began
        assert done.space in ("alpha", "beta")
        assert 5 <= took < 10, took
        (gave_up,) = [e for e in events if e.kind == "wake" and e.outcome == "timeout"]
        assert gave_up.seconds < 5.5, gave_up  # at the first poll (0.25 s) past the deadline
        assert control.count("wake", "sleepy") == 1
        stats = await pool.stats()
        assert stats["pools"]["sleepy"]["up"] is False
        assert stats["pools"]["sleepy"]["lastError"] == "wake_timeout"
    finally:
        await pool.aclose()


async def test_request_deadline_bounds_the_wait_for_a_waking_space(
    clean_fleet: SpaceFleet,
) -> None:
    """A request whose own deadline (3 s) is shorter than the wake deadline (60 s) gets
    DeadlineExceeded at 3 s, holding no slot; the Space stays waking for others."""
    clock = VirtualClock()
    entry, _port = _sleeping_space("sleepy")
    control = FakeSpaceControl({"sleepy": "SLEEPING"})
    settings = PoolSettings(
        spaces=f"{entry},{clean_fleet.pool_spaces_env()}",
        coordinator_url="memory://",
        wake_timeout_s=60,
        wake_poll_s=1.0,
    )
    pool = Pool(settings, space_control=control, clock=clock)
    try:
        began = clock.now()
        with pytest.raises(DeadlineExceeded, match="waking"):
            await pool.predict("/echo", "hi", 0, space="sleepy", timeout=3)
        assert 3 <= clock.now() - began < 3.5
        stats = await pool.stats()
        assert stats["admission"]["globalInUse"] == 0
        assert stats["pools"]["sleepy"]["wake"]["state"] == "waking"
    finally:
        await pool.aclose()


async def test_paused_space_is_skipped_at_once(clean_fleet: SpaceFleet) -> None:
    """A Space the Hub reports PAUSED (by its owner) is skipped without waiting (on a
    virtual clock, where a wait for it would show as the wake deadline's 120 s)."""
    clock = VirtualClock()
    entry, _port = _sleeping_space("paused")
    control = FakeSpaceControl({"paused": "PAUSED"})
    settings = PoolSettings(
        spaces=f"{entry},{clean_fleet.pool_spaces_env()}", coordinator_url="memory://"
    )
    pool = Pool(settings, space_control=control, clock=clock)
    try:
        began = clock.now()
        done = await pool.predict("/echo", "hi", 0)
        assert done.space in ("alpha", "beta") and clock.now() - began < 3
        assert control.count("wake", "paused") == 0
    finally:
        await pool.aclose()


async def test_idle_pause_waits_for_idle_period_and_minimum_uptime(
    clean_fleet: SpaceFleet,
) -> None:
    """An owned idle Space is paused only once idle for the idle period (60 s) AND up
    for the minimum up-time (600 s), and then at the next maintenance tick; a later
    request restarts it and is served."""
    clock = VirtualClock()
    paused_at: list[float] = []
    control = FakeSpaceControl(
        {"alpha": "RUNNING", "beta": "RUNNING"},
        on_pause=lambda _name: paused_at.append(clock.now()),
    )
    settings = PoolSettings(
        spaces=clean_fleet.pool_spaces_env(),
        coordinator_url="memory://",
        idle_pause_s=60.0,
        min_uptime_s=600.0,
        pause_spaces="alpha",
        idle_timeout_s=10.0,  # maintenance ticks every 2 s
        min_connections=1,
    )
    pool = Pool(settings, space_control=control, clock=clock)
    finished: list[float] = []
    pool.hooks.append(lambda e: finished.append(clock.now()) if e.kind == "finished" else None)
    try:
        up_since = clock.now()  # before start: the pool's own up-time starts after it
        await pool.start()
        await pool.predict("/echo", "x", 0, space="alpha")
        (last_use,) = finished  # stamped before the pool records the Space's last use
        await wait_until(lambda: control.count("pause", "alpha") == 1, 15)
        (paused,) = paused_at
        assert paused - up_since >= 600.0, "never within the minimum up-time"
        assert paused - last_use >= 60.0, "only after the idle period"
        assert paused - up_since < 620.0, "at a maintenance tick soon after both passed"
        assert control.count("pause", "beta") == 0, "only the Spaces the operator listed"
        stats = await pool.stats()
        assert stats["pools"]["alpha"]["wake"]["state"] == "paused"
        assert stats["pools"]["alpha"]["availableConnections"] == 0
        done = await pool.predict("/echo", "again", 0, space="alpha")
        assert done.result == "alpha:again"
        assert control.count("restart", "alpha") == 1
        assert pool.board.get("alpha").paused is False
    finally:
        await pool.aclose()


async def test_busy_space_is_never_paused(clean_fleet: SpaceFleet) -> None:
    """While a request holds an owned Space (its call made, the client kept for two
    minutes, twice the idle period, with maintenance ticking every 2 s), it is not
    paused; once the request ends and the idle period passes, it is."""
    clock = VirtualClock()
    paused_at: list[float] = []
    control = FakeSpaceControl(
        {"alpha": "RUNNING"},
        on_pause=lambda name: paused_at.append(clock.now()) if name == "alpha" else None,
    )
    settings = PoolSettings(
        spaces=clean_fleet.pool_spaces_env(),
        coordinator_url="memory://",
        idle_pause_s=60.0,
        min_uptime_s=0.0,
        pause_spaces="*",
        idle_timeout_s=10.0,  # maintenance ticks every 2 s
        min_connections=1,
    )
    pool = Pool(settings, space_control=control, clock=clock)
    finished: list[float] = []
    pool.hooks.append(lambda e: finished.append(clock.now()) if e.kind == "finished" else None)
    try:
        await pool.start()
        await pool.predict("/echo", "warm", 0, space="alpha")
        async with pool.client(space="alpha") as client:
            assert await client.predict("long", 0, api_name="/echo") == "alpha:long"
            held_from = clock.now()
            await clock.sleep(120.0)
            assert clock.now() - held_from >= 120.0
            assert control.count("pause", "alpha") == 0, "the held request kept it awake"
        ended = finished[-1]  # stamped before the pool records the Space's last use
        await wait_until(lambda: control.count("pause", "alpha") == 1, 10)
        (paused,) = paused_at
        assert paused - ended >= 60.0, "not before the idle period after the request"
    finally:
        await pool.aclose()
