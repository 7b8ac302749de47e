"""The pool against real Gradio Spaces: lazy start, caps, FIFO, isolation, stats."""

from __future__ import annotations

import asyncio
import time

import pytest

from devspaces import SpaceFleet
from pool import (
    BusyError,
    MisuseError,
    Pool,
    PoolError,
    UnknownEndpoint,
    UpstreamAppError,
    WaitTicket,
)
from tests.conftest import SPEC5_KEYS, SPEC5_POOL_KEYS, TRANSPORTS, PoolMaker


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs on both transports, through the same interface."""
    return str(request.param)


async def wait_until(predicate: object, timeout_s: float = 15.0) -> None:
    """Poll ``predicate()`` (sync or async) until true, failing after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()  # type: ignore[operator]
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def test_lazy_start_opens_one_then_fills_minimum(
    clean_fleet: SpaceFleet, make_pool: PoolMaker, transport: str
) -> None:
    """Nothing connects before the first request; it waits for one, then 5 open; the
    native transport reads the Space's /config once for all of them (once per app_id),
    each gradio_client Client reads it itself."""
    pool = make_pool(clean_fleet, min_connections=5, max_connections=8)
    await pool.start()
    assert (await pool.stats())["pools"]["alpha"]["totalConnections"] == 0
    assert all(s.stats().config_requests == 0 for s in clean_fleet)
    async with pool.client(space="alpha") as client:
        assert await client.predict("hi", 0, api_name="/echo") == "alpha:hi"
    alpha = clean_fleet["alpha"]
    await wait_until(lambda: pool.spaces["alpha"].total == 5)
    assert pool.spaces["alpha"].opened_total == 5
    assert alpha.stats().config_requests == (1 if transport == "native" else 5)
    assert clean_fleet["beta"].stats().config_requests == 0


async def test_grows_on_demand_but_never_above_max(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """80 concurrent requests on one Space open at most 50 connections; at most 50 run
    there at once."""
    pool = make_pool(
        clean_fleet, min_connections=5, max_connections=50,
        global_max_concurrent=200, consumer_max_concurrent=200, queue_timeout_s=90,
    )

    async def one(i: int) -> str:
        async with pool.client(space="alpha") as client:
            return str(await client.predict(str(i), 0.5, api_name="/echo"))

    results = await asyncio.gather(*(one(i) for i in range(80)))
    assert sorted(results) == sorted(f"alpha:{i}" for i in range(80))
    stats = clean_fleet["alpha"].stats()
    opened = pool.spaces["alpha"].opened_total
    assert opened <= 50
    assert stats.peak <= 50
    # Grown well past its minimum of 5 on demand (at the pace the window grows: 20+ on a
    # quiet machine, 13-18 seen under the whole suite's load on 2 cores).
    assert opened >= 10, "the pool should have grown under load"
    assert pool.spaces["alpha"].total <= 50


async def test_global_cap_holds_at_the_spaces(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """120 requests from 40 users over 2 Spaces, cap 6: the Spaces see 6 at most, and 6."""
    pool = make_pool(
        clean_fleet, global_max_concurrent=6, consumer_max_concurrent=2, queue_timeout_s=120
    )

    async def one(i: int) -> str:
        async with pool.client(f"user{i % 40}@example.com") as client:
            return str(await client.predict(str(i), 0.4, api_name="/echo"))

    results = await asyncio.gather(*(one(i) for i in range(120)))
    assert len(results) == 120
    assert all(r.endswith(f":{i}") for i, r in enumerate(results))
    peak = clean_fleet.concurrent_peak()
    assert peak == 6, f"fleet-wide concurrency measured at the Spaces was {peak}"
    stats = await pool.stats()
    assert stats["inUseConnections"] == 0 and stats["totalQueued"] == 0


async def test_waiters_are_served_in_arrival_order(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """With one slot, ten waiters get it in the order they arrived."""
    pool = make_pool(clean_fleet, global_max_concurrent=1, consumer_max_concurrent=10)
    order: list[int] = []
    gate = asyncio.Event()

    async def holder() -> None:
        async with pool.client(space="alpha"):
            await gate.wait()

    async def waiter(i: int) -> None:
        async with pool.client(f"u{i}@example.com", space="alpha"):
            order.append(i)

    hold = asyncio.create_task(holder())
    await wait_until(lambda: pool.spaces["alpha"].snapshot(3)["inUseConnections"] == 1)
    tasks = []
    for i in range(10):
        tasks.append(asyncio.create_task(waiter(i)))
        await wait_until(lambda n=i + 1: _waiting(pool, n))
    gate.set()
    await asyncio.gather(hold, *tasks)
    assert order == list(range(10))


async def _queued(pool: Pool) -> int:
    """Waiters in the coordinator, by its public snapshot."""
    return (await pool.coordinator.snapshot()).waiting


async def _waiting(pool: Pool, n: int) -> bool:
    return await _queued(pool) == n


async def test_queue_timeout_is_a_typed_busy_error_with_position(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """A waiter that times out gets BusyError with its position and an estimate."""
    pool = make_pool(clean_fleet, global_max_concurrent=1, queue_timeout_s=0.3)
    gate = asyncio.Event()

    async def holder() -> None:
        async with pool.client(space="alpha"):
            await gate.wait()

    hold = asyncio.create_task(holder())
    await wait_until(lambda: pool.spaces["alpha"].snapshot(3)["inUseConnections"] == 1)
    first = asyncio.create_task(_try(pool, "a@example.com", 2.0))
    await wait_until(lambda: _waiting(pool, 1))
    second = asyncio.create_task(_try(pool, "b@example.com", 0.3))
    busy_second = await second
    busy_first = await first
    gate.set()
    await hold
    assert busy_second.queue_position == 2
    assert busy_first.queue_position == 1
    assert busy_second.retry_after_s > 0 and busy_first.retry_after_s > 0


async def _try(pool: object, email: str, timeout_s: float) -> BusyError:
    try:
        async with pool.client(  # type: ignore[attr-defined]
            email, space="alpha", queue_timeout_s=timeout_s
        ):
            raise AssertionError("should not be admitted")
    except BusyError as exc:
        return exc


async def test_timeouts_and_cancellations_leak_nothing(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """After 100 queue timeouts and 100 cancellations, nothing is in use or queued."""
    pool = make_pool(
        clean_fleet, global_max_concurrent=2, consumer_max_concurrent=200, queue_timeout_s=0.2
    )
    gate = asyncio.Event()

    async def holder(i: int) -> None:
        async with pool.client(f"h{i}@example.com", space="alpha"):
            await gate.wait()

    holders = [asyncio.create_task(holder(i)) for i in range(2)]
    await wait_until(lambda: pool.spaces["alpha"].snapshot(3)["inUseConnections"] == 2)

    async def waiter(i: int) -> None:
        async with pool.client(f"w{i}@example.com", space="alpha"):
            pass

    timed_out = await asyncio.gather(*(waiter(i) for i in range(100)), return_exceptions=True)
    assert all(isinstance(r, BusyError) for r in timed_out)
    pool.settings.queue_timeout_s = 30.0
    cancelled = [asyncio.create_task(waiter(i)) for i in range(100)]
    await wait_until(lambda: _waiting(pool, 100))
    for task in cancelled:
        task.cancel()
    await asyncio.gather(*cancelled, return_exceptions=True)
    gate.set()
    await asyncio.gather(*holders)
    stats = await pool.stats()
    assert stats["inUseConnections"] == 0
    assert stats["totalQueued"] == 0
    assert stats["admission"]["globalInUse"] == 0
    async with pool.client("after@example.com", space="alpha") as client:
        assert await client.predict("x", 0, api_name="/echo") == "alpha:x"


async def test_ticket_reports_position_while_waiting(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """A WaitTicket shows the queue position and an estimate while the request waits."""
    pool = make_pool(clean_fleet, global_max_concurrent=1)
    gate = asyncio.Event()

    async def holder() -> None:
        async with pool.client(space="alpha"):
            await gate.wait()

    hold = asyncio.create_task(holder())
    await wait_until(lambda: pool.spaces["alpha"].snapshot(3)["inUseConnections"] == 1)
    ticket = WaitTicket()

    async def waiter() -> str:
        async with pool.client("t@example.com", space="alpha", ticket=ticket) as client:
            return str(await client.predict("t", 0, api_name="/echo"))

    task = asyncio.create_task(waiter())
    await wait_until(lambda: ticket.position == 1)
    assert ticket.estimate_s > 0
    gate.set()
    assert await task == "alpha:t"
    await hold


async def test_state_does_not_leak_between_users(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """gr.State written in user A's lease is not visible in user B's next lease."""
    pool = make_pool(clean_fleet, min_connections=1, max_connections=1)
    async with pool.client("a@example.com", space="alpha") as client:
        assert await client.predict("secret-of-a", api_name="/state") == ""
        assert await client.predict("again", api_name="/state") == "secret-of-a"
        conn_id = id(client.raw)
    async with pool.client("b@example.com", space="alpha") as client:
        assert id(client.raw) == conn_id, "the same connection was reused"
        assert await client.predict("b", api_name="/state") == ""


async def test_handle_is_dead_after_release(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """Using a handle after its lease ended raises MisuseError."""
    pool = make_pool(clean_fleet)
    async with pool.client(space="alpha") as client:
        pass
    with pytest.raises(MisuseError):
        await client.predict("x", 0, api_name="/echo")


async def test_errors_are_typed_and_keep_the_slot_count(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """An app error and an unknown api_name map to our types and free everything."""
    pool = make_pool(clean_fleet)
    with pytest.raises(UpstreamAppError, match="failed: boom"):
        async with pool.client(space="alpha") as client:
            await client.predict("boom", api_name="/fail")
    with pytest.raises(UnknownEndpoint) as info:
        async with pool.client(space="alpha") as client:
            await client.predict("x", api_name="/nope")
    assert "/echo" in info.value.available
    stats = await pool.stats()
    assert stats["inUseConnections"] == 0 and stats["admission"]["globalInUse"] == 0
    assert isinstance(info.value, PoolError)


async def test_stats_have_every_spec_key(clean_fleet: SpaceFleet, make_pool: PoolMaker) -> None:
    """pool-stats carries every key of SPEC section 5, before and after start."""
    pool = make_pool(clean_fleet)
    before = await pool.stats()
    assert before.keys() >= SPEC5_KEYS and before["initialized"] is False
    async with pool.client("x@example.com") as client:
        await client.predict("x", 0, api_name="/echo")
    after = await pool.stats()
    assert after.keys() >= SPEC5_KEYS
    assert after["initialized"] is True and after["userAssignments"] == 1
    for entry in after["pools"].values():
        assert entry.keys() >= SPEC5_POOL_KEYS
    assert "x@example.com" not in repr(after)


async def test_idle_connections_above_minimum_are_closed(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """Connections idle longer than the idle timeout are closed down to the minimum
    (once the burst's peak has left the warm window, pool/connections/_warmth.py)."""
    pool = make_pool(
        clean_fleet, min_connections=1, max_connections=6, idle_timeout_s=1.0,
        consumer_max_concurrent=10, warm_window_s=0.5,
    )

    async def one(i: int) -> None:
        async with pool.client(space="alpha") as client:
            await client.predict(str(i), 0.5, api_name="/echo")

    await asyncio.gather(*(one(i) for i in range(4)))
    space = pool.spaces["alpha"]
    assert space.total >= 2
    await wait_until(lambda: space.total == 1, timeout_s=10)
    async with pool.client(space="alpha") as client:
        assert await client.predict("again", 0, api_name="/echo") == "alpha:again"
