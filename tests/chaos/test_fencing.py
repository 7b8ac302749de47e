"""Self-fencing, measured at the Space: a holder that loses its lease stops its job.

Global cap 1, lease TTL 3 s (local expiry 2.4 s after the last renewal). Holder A is
a pool process of its own running one long predict; B is a pool in the test process
on the same store. Concurrency is read from the Space's own clock (its intervals).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from app.core._errors import describe
from devspaces import SpaceFleet, SpaceProcess
from pool import LeaseLost, Pool, PoolSettings

from ._infra import BlackHoleProxy, PrivateRedis
from .conftest import LEASE_TTL_S, Procs, pool_env, read_json, read_line

FREEZE_S = 8.0


async def until(check: object, timeout_s: float, what: str) -> None:
    """Poll the Space-reading ``check`` every 20 ms until it holds (bounded)."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(check):  # type: ignore[arg-type]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def b_pool(space: SpaceProcess, url: str) -> Pool:
    return Pool(
        PoolSettings(
            spaces=f"{space.name}={space.url}",
            coordinator_url=url,
            global_max_concurrent=1,
            lease_ttl_s=LEASE_TTL_S,
            queue_timeout_s=20,
        )
    )


async def test_frozen_holder_is_fenced_at_once_when_it_resumes(
    clean_fleet: SpaceFleet, private_redis: PrivateRedis, procs: Procs
) -> None:
    """A SIGSTOPped 8 s, B admitted meanwhile; on SIGCONT A's upstream job ends within
    1 s and A's caller gets LeaseLost; A and B overlap only from freeze to cancel."""
    space = clean_fleet["alpha"]
    base = space.stats().in_flight  # calls an earlier test left running there
    url = f"{private_redis.url}?prefix=freeze:"
    a = procs.spawn("tests.chaos._holder", url, "A", "60",
                    env=pool_env(f"alpha={space.url}"))  # fmt: skip
    assert await read_line(a, 30) == "admitted"
    await until(lambda: space.stats().in_flight == base + 1, 10, "A's job to run at the Space")
    frozen_at = time.time()
    os.kill(a.pid, signal.SIGSTOP)
    pool = b_pool(space, url)
    try:
        b = asyncio.create_task(pool.predict("/echo", "B", 6.0))
        await until(lambda: space.stats().in_flight == base + 2, FREEZE_S, "B to be admitted")
        b_admitted = time.time() - frozen_at
        await asyncio.sleep(max(0.0, frozen_at + FREEZE_S - time.time()))  # the freeze
        resumed_at = time.time()
        os.kill(a.pid, signal.SIGCONT)
        outcome = await read_json(a, 10)
        assert (await b).result == "alpha:B"
    finally:
        await pool.aclose()
    assert outcome["error"] == "lease_lost", outcome
    (a_start, a_end), (b_start, b_end) = sorted(space.intervals())
    cancel_after_resume = a_end - resumed_at
    overlap = min(a_end, b_end) - max(a_start, b_start)
    print(f"B admitted {b_admitted:.2f} s into the freeze; A's job ended "
          f"{cancel_after_resume:.3f} s after SIGCONT; overlap {overlap:.2f} s")  # fmt: skip
    # A renews every TTL/3, so its last renewal came up to TTL/3 before the freeze and the
    # store's expiry of its lease up to TTL/3 earlier than frozen_at + TTL.
    earliest_expiry = LEASE_TTL_S - LEASE_TTL_S / 3
    assert b_admitted >= earliest_expiry - 0.05, "B got in before A's lease expired in the store"
    assert cancel_after_resume <= 1.0
    assert overlap <= a_end - frozen_at


async def test_partitioned_holder_stops_before_the_store_admits_anyone(
    clean_fleet: SpaceFleet, private_redis: PrivateRedis, procs: Procs
) -> None:
    """A cut off from Redis (alive, its traffic black-holed) cancels its job at its
    local expiry, before the store's TTL lets B in: no overlap at the Space at all."""
    space = clean_fleet["alpha"]
    base = space.stats().in_flight  # calls an earlier test left running there
    prefix = "?prefix=partition:"
    proxy = BlackHoleProxy(private_redis.port)
    await proxy.start()
    pool = b_pool(space, private_redis.url + prefix)
    try:
        a = procs.spawn("tests.chaos._holder", f"redis://127.0.0.1:{proxy.port}/0{prefix}",
                        "A", "60", env=pool_env(f"alpha={space.url}"))  # fmt: skip
        assert await read_line(a, 30) == "admitted"
        await until(lambda: space.stats().in_flight == base + 1, 10, "A's job to run at the Space")
        cut_at = time.time()
        proxy.cut()
        b = await pool.predict("/echo", "B", 0.5)
        outcome = await read_json(a, 10)
    finally:
        await pool.aclose()
        await proxy.aclose()
    assert b.result == "alpha:B"
    assert outcome == {"error": "lease_lost", "why": "expired", "at": outcome["at"]}
    (_, a_end), (b_start, _) = sorted(space.intervals())
    gap = b_start - a_end
    print(f"A's job ended {a_end - cut_at:.2f} s after the cut, B's began {gap:.3f} s later")
    assert gap > 0, f"A and B overlapped at the Space by {-gap:.3f} s"
    assert a_end - cut_at <= LEASE_TTL_S


def test_lease_lost_is_a_typed_503_with_retry_after() -> None:
    """LeaseLost is a BusyError (reason lease_lost): HTTP 503, Retry-After, no 500."""
    problem = describe(LeaseLost("lease lost (expired)", why="expired", retry_after_s=1.2))
    assert problem.status == 503 and problem.headers == {"Retry-After": "2"}
    assert problem.body["error"] == "busy" and problem.body["reason"] == "lease_lost"
    assert problem.body["lease"] == "expired"
