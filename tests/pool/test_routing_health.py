"""Sticky users, least-loaded routing, health probes, restarts, failover, clean close."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap

from devspaces import SpaceFleet
from pool import NoHealthySpaceError, Pool, PoolError, PoolSettings
from tests._vclock import VirtualClock
from tests.conftest import PoolMaker
from tests.pool.test_core import wait_until


async def _space_for(pool: Pool, email: str | None) -> str:
    async with pool.client(email) as client:
        await client.predict("x", 0, api_name="/echo")
        return client.space


async def test_users_stick_until_ttl_and_new_users_alternate(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """Same email → same Space until the 1 h TTL passes; new users alternate."""
    clock = VirtualClock(autojump=False)  # only the test moves time past real time
    pool = make_pool(clean_fleet, clock=clock, assignment_ttl_s=3600)
    made_after = clock.now()
    firsts = [await _space_for(pool, "new0@example.com")]
    pinned_by = clock.now()  # new0's pin was made between these two
    firsts += [await _space_for(pool, f"new{i}@example.com") for i in range(1, 4)]
    assert firsts in (["alpha", "beta"] * 2, ["beta", "alpha"] * 2)
    for _ in range(3):
        assert await _space_for(pool, "new0@example.com") == firsts[0]
    await clock.advance(made_after + 3599 - clock.now())  # 1 s (at least) before the TTL
    assert await _space_for(pool, "new0@example.com") == firsts[0]
    await clock.advance(pinned_by + 3601 - clock.now())  # 1 s (at least) after it
    assert await pool.router.pinned(pool.hash_user("new0@example.com") or "") is None
    assert await _space_for(pool, "someone-else@example.com") == firsts[0]
    assert await _space_for(pool, "new0@example.com") == firsts[1]


async def test_anonymous_requests_go_to_the_least_loaded_space(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """An anonymous request avoids the Space that is busy."""
    # The holders and the request are all anonymous: one consumer, 3 slots at once.
    pool = make_pool(clean_fleet, anonymous_max_concurrent=3)
    for busy, expected in (("alpha", "beta"), ("beta", "alpha")):
        gate = asyncio.Event()

        async def hold(space: str = busy, g: asyncio.Event = gate) -> None:
            async with pool.client(space=space):
                await g.wait()

        holders = [asyncio.create_task(hold()) for _ in range(2)]
        await wait_until(lambda s=busy: pool.spaces[s].snapshot(3)["inUseConnections"] == 2)
        assert await _space_for(pool, None) == expected
        gate.set()
        await asyncio.gather(*holders)


async def test_unhealthy_pinned_space_moves_the_user(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """A user pinned to a Space marked down is moved, and the move is recorded."""
    pool = make_pool(clean_fleet)
    first = await _space_for(pool, "mover@example.com")
    pool.spaces[first].mark_down("connect", 60)
    second = await _space_for(pool, "mover@example.com")
    assert second != first
    assert await pool.router.pinned(pool.hash_user("mover@example.com") or "") == second
    pool.spaces[second].mark_down("connect", 60)
    try:
        await _space_for(pool, "mover@example.com")
    except NoHealthySpaceError:
        pass
    else:
        raise AssertionError("expected NoHealthySpaceError with every Space down")


async def test_three_failed_probes_replace_a_connection(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """A connection failing 3 probes in a row is discarded and a fresh one opened."""
    pool = make_pool(clean_fleet, min_connections=2, max_connections=4, health_sample=5)
    await _space_for(pool, None)
    space = pool.spaces["alpha"] if pool.spaces["alpha"].total else pool.spaces["beta"]
    stand_in = clean_fleet[space.name]
    await wait_until(lambda: space.total == 2 and space.snapshot(3)["availableConnections"] == 2)
    before = {c.id for c in space.idle_sample(5)}
    opened = space.opened_total
    stand_in.control(mode="probe_fail")
    try:
        for round_ in range(3):
            await pool.health_check()
            if round_ < 2:
                assert {c.id for c in space.idle_sample(5)} == before
                assert space.snapshot(3)["unhealthyConnections"] == 2
    finally:
        stand_in.control(mode="ok")
    await wait_until(lambda: space.total == 2 and space.opened_total == opened + 2)
    assert not before & {c.id for c in space.idle_sample(5)}
    assert pool.last_health_check is not None


async def test_restarted_space_gets_fresh_connections(make_pool: PoolMaker) -> None:
    """A new app_id (the Space restarted) makes the pool rebuild its connections."""
    with SpaceFleet(names=["solo"]) as fleet:
        pool = make_pool(fleet, min_connections=2, max_connections=4)
        await _space_for(pool, None)
        space = pool.spaces["solo"]
        await wait_until(lambda: space.total == 2)
        old_app_id = space.app_id
        fleet["solo"].restart()
        await pool.health_check()
        await wait_until(lambda: fleet["solo"].stats().config_requests >= 1)  # read again
        await wait_until(lambda: space.total == 2 and space.opened_total >= 4)
        assert space.app_id != old_app_id
        assert await _space_for(pool, None) == "solo"
        assert all(c.app_id == space.app_id for c in space.idle_sample(5))


async def test_killed_space_fails_over_to_the_other(make_pool: PoolMaker) -> None:
    """SIGKILL of one Space mid-run: in-flight calls fail typed or succeed; later all succeed."""
    with SpaceFleet(names=["k1", "k2"]) as fleet:
        pool = make_pool(fleet, min_connections=2, global_max_concurrent=20)

        async def one(i: int) -> str:
            async with pool.client(f"user{i}@example.com") as client:
                return str(await client.predict(str(i), 1.0, api_name="/echo"))

        running = [asyncio.create_task(one(i)) for i in range(10)]
        await wait_until(lambda: fleet["k1"].stats().in_flight > 0)
        fleet["k1"].kill(signal.SIGKILL)
        outcomes = await asyncio.gather(*running, return_exceptions=True)
        assert all(isinstance(o, (str, PoolError)) for o in outcomes), outcomes
        later = await asyncio.gather(*(one(100 + i) for i in range(10)))
        assert all(r.startswith("k2:") for r in later)
        stats = await pool.stats()
        assert stats["pools"]["k1"]["up"] is False


_CLOSE_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os, sys, threading
    from pool import Clock, Pool, PoolSettings

    def counts():
        return threading.active_count(), len(os.listdir("/proc/self/fd"))

    async def main():
        pool = Pool(PoolSettings(spaces=sys.argv[1], coordinator_url="memory://",
                                 global_max_concurrent=8))
        baseline = counts()
        async def one(i):
            async with pool.client(f"u{i}@example.com") as client:
                return await client.predict(str(i), 0.2, api_name="/echo")
        await asyncio.gather(*(one(i) for i in range(30)))
        during = counts()
        await pool.aclose()  # waits for what it closes: no grace period after it
        print(json.dumps({"baseline": baseline, "during": during, "after": counts()}))

    asyncio.run(main())
    """
)


def test_close_returns_threads_and_fds_to_baseline(clean_fleet: SpaceFleet) -> None:
    """After aclose() the process's threads and open fds return to their baseline."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", _CLOSE_SCRIPT, clean_fleet.pool_spaces_env()],
        capture_output=True, text=True, timeout=90, env=env, check=True,
    )
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    # The native transport runs on the event loop: connections, not threads.
    assert figures["during"][1] > figures["baseline"][1], "the run should have used sockets"
    assert figures["during"][0] == figures["baseline"][0], "no thread per connection"
    assert figures["after"] == figures["baseline"], figures


def test_settings_reject_nonsense() -> None:
    """min above max and an empty Space list are refused with clear errors."""
    try:
        PoolSettings(min_connections=10, max_connections=5)
    except ValueError as exc:
        assert "POOL_MIN_CONNECTIONS" in str(exc)
    else:
        raise AssertionError("min > max accepted")
    try:
        Pool(PoolSettings(spaces=""))
    except ValueError as exc:
        assert "POOL_SPACES" in str(exc)
    else:
        raise AssertionError("empty POOL_SPACES accepted")
