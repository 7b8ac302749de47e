"""Failover when a Space cannot be reached, and per-request deadlines."""

from __future__ import annotations

import asyncio
import time

import pytest

from devspaces import SpaceFleet, SpaceProcess, free_port
from pool import DeadlineExceeded, NoHealthySpaceError, Pool, PoolError, PoolSettings
from tests.pool.test_core import wait_until


def _pool(spaces: str, **kw: object) -> Pool:
    settings = PoolSettings(spaces=spaces, coordinator_url="memory://", **kw)  # type: ignore[arg-type]
    return Pool(settings)


async def test_unreachable_space_fails_over_after_retries(clean_fleet: SpaceFleet) -> None:
    """A Space nobody answers is given up on, the request is served elsewhere and the
    user re-pinned there (test_failures counts the connect attempts themselves)."""
    dead = f"http://127.0.0.1:{free_port()}/"
    pool = _pool(f"dead={dead},{clean_fleet.pool_spaces_env()}", connect_attempts=3)
    try:
        await pool.start()
        # Force the dead Space first: a user pinned there is moved.
        user = "pinned@example.com"
        await pool.router.claim(pool.hash_user(user) or "", "dead")
        async with pool.client(user) as client:
            assert client.space in ("alpha", "beta")
            assert await client.predict("x", 0, api_name="/echo") == f"{client.space}:x"
        assert await pool.router.pinned(pool.hash_user(user) or "") == client.space
        stats = await pool.stats()
        assert stats["pools"]["dead"]["up"] is False
        assert stats["pools"]["dead"]["lastError"] == "connect"
    finally:
        await pool.aclose()


async def test_all_spaces_failing_is_a_typed_error() -> None:
    """When every Space fails to connect, the caller gets NoHealthySpaceError."""
    a, b = (f"http://127.0.0.1:{free_port()}/" for _ in range(2))
    pool = _pool(f"a={a},b={b}", connect_attempts=1)
    try:
        with pytest.raises(NoHealthySpaceError, match="connect"):
            async with pool.client("x@example.com"):
                pass
        stats = await pool.stats()
        assert stats["inUseConnections"] == 0 and stats["admission"]["globalInUse"] == 0
    finally:
        await pool.aclose()


async def test_deadline_cancels_the_upstream_job(clean_fleet: SpaceFleet) -> None:
    """A 1 s deadline on a hanging predict: DeadlineExceeded near 1 s, job gone, slot free."""
    pool = _pool(clean_fleet.pool_spaces_env())
    alpha = clean_fleet["alpha"]
    alpha.control(mode="hang")
    try:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            async with pool.client(space="alpha") as client:
                await client.predict("x", 0, api_name="/echo", timeout=1.0)
        elapsed = time.monotonic() - started
        assert 1.0 <= elapsed < 3.0, elapsed
        stats = await pool.stats()
        assert stats["inUseConnections"] == 0 and stats["admission"]["globalInUse"] == 0
        await wait_until(lambda: alpha.stats().in_flight == 0, timeout_s=5)
    finally:
        alpha.control(mode="ok")
        await pool.aclose()


async def test_cancelled_caller_cancels_upstream_and_frees_slot(clean_fleet: SpaceFleet) -> None:
    """Cancelling the task that awaits a predict cancels the job and frees everything."""
    pool = _pool(clean_fleet.pool_spaces_env())
    alpha = clean_fleet["alpha"]
    alpha.control(mode="hang")
    try:

        async def call() -> None:
            async with pool.client(space="alpha") as client:
                await client.predict("x", 0, api_name="/echo")

        task = asyncio.create_task(call())
        await wait_until(lambda: alpha.stats().in_flight == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stats = await pool.stats()
        assert stats["inUseConnections"] == 0 and stats["admission"]["globalInUse"] == 0
        await wait_until(lambda: alpha.stats().in_flight == 0, timeout_s=5)
    finally:
        alpha.control(mode="ok")
        await pool.aclose()


async def test_deadline_bounds_connecting_to_a_space_whose_config_hangs() -> None:
    """A Space whose /config never answers, timeout=3: DeadlineExceeded by 3.5 s, slots free."""
    with SpaceProcess("cold", config_delay_s=600.0) as cold:
        pool = _pool(f"cold={cold.url}", connect_attempts=1, min_connections=1)
        try:
            await pool.start()
            started = time.monotonic()
            with pytest.raises(DeadlineExceeded, match="connecting"):
                await pool.predict("/echo", "x", 0, email="u@example.com", timeout=3.0)
            elapsed = time.monotonic() - started
            assert 2.9 <= elapsed < 3.5, elapsed
            assert cold.stats().config_requests >= 1, "the Space was asked for its /config"
            snap = await pool.coordinator.snapshot()
            assert sum(snap.held.values()) == 0 and snap.waiting == 0, snap
            stats = await pool.stats()
            assert stats["inUseConnections"] == 0 and stats["admission"]["globalInUse"] == 0
        finally:
            cold.stop()  # ends the /config read the background open is still blocked in
            await pool.aclose()


async def test_aclose_cancels_a_running_job_upstream(clean_fleet: SpaceFleet) -> None:
    """aclose() while a job runs: the Space stops it too (a Space keeps running a job
    whose stream was cut, on a slot the closing pool gives back)."""
    pool = _pool(clean_fleet.pool_spaces_env())
    alpha = clean_fleet["alpha"]
    alpha.control(mode="hang")
    before = alpha.stats().in_flight

    async def call() -> None:
        async with pool.client(space="alpha") as client:
            await client.predict("x", 0, api_name="/echo")

    task = asyncio.create_task(call())
    try:
        await wait_until(lambda: alpha.stats().in_flight == before + 1)
        await pool.aclose()
        await wait_until(lambda: alpha.stats().in_flight == before, timeout_s=3)
        with pytest.raises(PoolError):
            await task
    finally:
        task.cancel()
        alpha.control(mode="ok")
        await pool.aclose()
