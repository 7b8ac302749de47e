"""The process-local half of fencing, on real stores in this process (fast, no Spaces).

A stalled loop fences on resume before anything else; a loaded but live loop keeps
its lease; a store that forgets (a flushed Redis, a deleted or replaced SQLite file)
gets the live leases back before it grants anything, or the holder fences itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from pathlib import Path

import pytest

from devspaces import SpaceFleet
from pool import BusyError, LeaseLost, Pool, PoolEvent, PoolSettings
from pool.admission import GLOBAL_RESOURCE
from tests.admission.conftest import Opener, drop_prefix, make_url
from tests.admission.helpers import queue, until, until_async

from ._infra import PrivateRedis

TTL_S = 1.0


async def test_stalled_loop_is_fenced_before_its_next_step(
    shared_url: str, open_store: Opener
) -> None:
    """A loop blocked past the lease's local expiry: the very first check raises
    LeaseLost and the holder's callbacks ran; the slot goes to the next in line."""
    holder, other = open_store(shared_url, lease_ttl_s=TTL_S), open_store(shared_url)
    await holder.set_limits({GLOBAL_RESOURCE: 1})
    lease = await holder.acquire([GLOBAL_RESOURCE], timeout=3)
    fenced: list[LeaseLost] = []
    lease.on_lost(fenced.append)
    time.sleep(TTL_S)  # noqa: ASYNC251  (the stall under test: the loop runs nothing)
    with pytest.raises(LeaseLost) as caught:
        lease.check()  # before any await: a resumed handle stops here
    assert caught.value.why == "expired" and [e.why for e in fenced] == ["expired"]
    taken = await other.acquire([GLOBAL_RESOURCE], timeout=3)  # the store's TTL ran out
    await holder.release(lease)
    await other.release(taken)


async def test_loaded_loop_keeps_its_lease(shared_url: str, open_store: Opener) -> None:
    """A loop busy in 50 ms CPU bursts for 2 TTLs still renews in time: not lost.

    The TTL leaves a renewal ~1.4 s (its period plus the margin): a round trip takes a
    few loop turns of 50 ms here, and a 1.5 s TTL (0.7 s) was lost once on a loaded
    machine, the suite's other workers and their Spaces sharing the 2 cores."""
    ttl_s = 3.0
    coord = open_store(shared_url, lease_ttl_s=ttl_s)
    await coord.set_limits({GLOBAL_RESOURCE: 1})
    lease = await coord.acquire([GLOBAL_RESOURCE], timeout=3)
    loop = asyncio.get_running_loop()
    end = loop.time() + 2 * ttl_s
    while loop.time() < end:
        busy_until = time.monotonic() + 0.05
        while time.monotonic() < busy_until:
            pass
        await asyncio.sleep(0)
    lease.check()
    assert (await coord.snapshot()).held == {GLOBAL_RESOURCE: 1}
    await coord.release(lease)


async def test_holder_whose_slot_was_given_away_fences_itself(open_store: Opener) -> None:
    """Redis prefix flushed, a newcomer admitted into the empty store: the old holder's
    next heartbeat cannot re-register its lease and fences it (not_restored)."""
    url = next(iter(make_url("redis", Path("/nonexistent"))))
    prefix = url.partition("prefix=")[2].partition("&")[0]
    try:
        # A TTL of 3 s: its heartbeat (every third) comes well before the lease could
        # expire on its own, also on a loaded machine (1.5 s saw "expired" in CI).
        holder = open_store(url, lease_ttl_s=3.0)
        await holder.set_limits({GLOBAL_RESOURCE: 1})
        lease = await holder.acquire([GLOBAL_RESOURCE], timeout=3)
        fenced: list[LeaseLost] = []
        lease.on_lost(fenced.append)
        drop_prefix(prefix)  # a FLUSH: the store forgets everything
        newcomer = open_store(url, lease_ttl_s=3.0)
        await newcomer.set_limits({GLOBAL_RESOURCE: 1})
        taken = await newcomer.acquire([GLOBAL_RESOURCE], timeout=3)
        await until(lambda: bool(fenced), timeout=3.0, what="the holder to fence itself")
        assert fenced[0].why == "not_restored"
        assert (await newcomer.snapshot()).held == {GLOBAL_RESOURCE: 1}
        await holder.release(lease)
        await newcomer.release(taken)
    finally:
        drop_prefix(prefix)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_sqlite_file_deleted_or_replaced_keeps_the_cap(
    how: str, tmp_path: Path, open_store: Opener
) -> None:
    """The file is deleted (or replaced by an empty copy) under two processes: the
    holder re-registers its lease, the other is not admitted while it is held, and
    is admitted in order once it is released; the lease is never lost."""
    path = tmp_path / "store" / "admission.db"
    url = f"sqlite:///{path}"
    holder, other = open_store(url, lease_ttl_s=TTL_S), open_store(url, lease_ttl_s=TTL_S)
    await holder.set_limits({GLOBAL_RESOURCE: 1})
    await other.snapshot()  # both have the file open
    if how == "replaced":
        shutil.copytree(path.parent, tmp_path / "copy")  # an empty older snapshot
    lease = await holder.acquire([GLOBAL_RESOURCE], timeout=1)
    for name in os.listdir(path.parent):
        os.remove(path.parent / name)
    if how == "replaced":
        for name in os.listdir(tmp_path / "copy"):
            os.replace(tmp_path / "copy" / name, path.parent / name)
    with pytest.raises(BusyError):  # quarantine, then the re-registered lease holds it
        await other.acquire([GLOBAL_RESOURCE], timeout=2 * TTL_S)
    snap = await other.snapshot()
    assert snap.held == {GLOBAL_RESOURCE: 1}, snap
    waiter, _ = await queue(other, [GLOBAL_RESOURCE], timeout=3)
    lease.check()
    await holder.release(lease)
    await other.release(await waiter)


async def test_handle_of_a_lost_lease_refuses_new_work(
    clean_fleet: SpaceFleet, tmp_path: Path
) -> None:
    """A stall past the local expiry inside ``client()``: the next submit raises
    LeaseLost, nothing reaches the Space, and the pool emits one lease_lost event."""
    pool = Pool(PoolSettings(spaces=clean_fleet.pool_spaces_env(), lease_ttl_s=TTL_S,
                             coordinator_url=f"sqlite:///{tmp_path}/pool.db"))  # fmt: skip
    events: list[PoolEvent] = []
    pool.hooks.append(events.append)
    try:
        with pytest.raises(LeaseLost):
            async with pool.client() as client:
                assert await client.predict("before", 0, api_name="/echo")
                time.sleep(TTL_S)  # noqa: ASYNC251  (the stall under test)
                await client.predict("after", 0, api_name="/echo")
    finally:
        await pool.aclose()
    assert sum(space.stats().total for space in clean_fleet) == 1
    assert [(e.kind, e.outcome) for e in events if e.kind == "lease_lost"] == [
        ("lease_lost", "expired")
    ]


async def test_redis_restarted_empty_requeues_waiters_in_order(
    private_redis: PrivateRedis, open_store: Opener
) -> None:
    """Redis restarted empty: the holder re-registers its lease and the waiters are
    re-queued in their order; nobody is admitted until the holder releases."""
    url = f"{private_redis.url}?prefix=requeue:"
    holder, other = open_store(url, lease_ttl_s=TTL_S), open_store(url, lease_ttl_s=TTL_S)
    await holder.set_limits({GLOBAL_RESOURCE: 1})
    lease = await holder.acquire([GLOBAL_RESOURCE], timeout=3)  # after the young-server wait
    first, _ = await queue(other, [GLOBAL_RESOURCE], timeout=10)
    second, _ = await queue(other, [GLOBAL_RESOURCE], timeout=10)
    private_redis.kill()
    private_redis.start()  # empty

    async def restored() -> bool:
        with contextlib.suppress(BusyError):
            snap = await other.snapshot()
            return snap.held == {GLOBAL_RESOURCE: 1} and snap.waiting == 2
        return False

    await until_async(restored, timeout=5, what="the lease and both waiters re-registered")
    done, _ = await asyncio.wait({first, second}, timeout=2 * TTL_S)  # past the quarantine
    assert not done, "admitted while the re-registered lease was still held"
    lease.check()
    await holder.release(lease)
    granted = await asyncio.wait_for(first, 3)
    assert not second.done()
    await other.release(granted)
    await other.release(await asyncio.wait_for(second, 3))
