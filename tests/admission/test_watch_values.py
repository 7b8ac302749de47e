"""``SharedValues.watch``: a write anywhere in the fleet wakes the watchers of its key,
in every store (Redis: pub/sub; SQLite: the store's own loop; memory: the write)."""

from __future__ import annotations

import asyncio
import time
import uuid

from pool import BusyError
from pool.admission import Coordinator
from tests.admission.conftest import Opener
from tests.chaos._infra import PrivateRedis

WITHIN_S = 1.0  # SQLite's loop reads every 50 ms and Redis pushes: far below this


async def test_a_write_by_another_process_wakes_the_watcher(
    shared_url: str, open_store: Opener
) -> None:
    """A watcher of ``job:a`` in one coordinator wakes when a second coordinator on the
    same store (as another process) writes it, and reads the new value."""
    watching, writing = open_store(shared_url), open_store(shared_url)
    async with watching.values.watch("job:a") as changed:
        while await changed.wait(0.2):  # a first wake-up may be spurious (a new key)
            pass
        started = time.monotonic()
        await writing.values.put("job:a", "v2", ttl_s=30)
        assert await changed.wait(WITHIN_S)
        took = time.monotonic() - started
        assert await watching.values.get("job:a") == "v2"
    assert took < WITHIN_S, took


async def test_updates_and_deletes_wake_too_and_other_keys_do_not(
    shared_url: str, open_store: Opener
) -> None:
    """An update and a delete of the key wake its watcher; a write of another key
    (same namespace) does not."""
    watching, writing = open_store(shared_url), open_store(shared_url)
    await writing.values.put("job:b", "1", ttl_s=30)
    async with watching.values.watch("job:b") as changed:
        while await changed.wait(0.2):
            pass
        await writing.values.put("job:other", "x", ttl_s=30)
        assert not await changed.wait(0.3)
        await writing.values.update("job:b", lambda raw: "2", ttl_s=30)
        assert await changed.wait(WITHIN_S)
        await writing.values.delete("job:b")
        assert await changed.wait(WITHIN_S)
        assert await watching.values.get("job:b") is None


async def test_a_write_before_the_wait_is_not_lost(coord: Coordinator) -> None:
    """Wake-ups are level-triggered: a write between watching and waiting (here, by
    the watcher's own process) is reported by the next wait at once."""
    async with coord.values.watch("job:c") as changed:
        await coord.values.put("job:c", "1", ttl_s=30)
        started = time.monotonic()
        assert await changed.wait(WITHIN_S)
        assert time.monotonic() - started < WITHIN_S


async def test_many_watchers_of_one_key_all_wake(shared_url: str, open_store: Opener) -> None:
    """Twenty watchers of one key in one process (one listener for all) each wake once
    the key is written elsewhere."""
    watching, writing = open_store(shared_url), open_store(shared_url)

    async def watch() -> bool:
        async with watching.values.watch("job:d") as changed:
            while await changed.wait(0.2):
                pass
            ready.release()
            return await changed.wait(5.0)

    ready = asyncio.Semaphore(0)
    tasks = [asyncio.create_task(watch()) for _ in range(20)]
    for _ in tasks:
        await ready.acquire()
    await writing.values.put("job:d", "x", ttl_s=30)
    assert await asyncio.gather(*tasks) == [True] * 20


async def test_a_watcher_outlives_a_redis_restart(
    private_redis: PrivateRedis, open_store: Opener
) -> None:
    """Redis restarts under a watcher: the resubscribed listener wakes it (a write may
    have been missed meanwhile), and a write after the restart wakes it again."""
    url = f"{private_redis.url}?prefix={uuid.uuid4().hex[:8]}:"
    watching, writing = open_store(url), open_store(url)
    async with watching.values.watch("job:r") as changed:
        while await changed.wait(0.2):
            pass
        private_redis.kill()
        private_redis.start()
        assert await changed.wait(10), "not woken by the resubscription"
        while await changed.wait(0.2):
            pass
        deadline = time.monotonic() + 10
        while True:  # the writer's first call after the restart may find its connection dead
            try:
                await writing.values.put("job:r", "after", ttl_s=30)
                break
            except BusyError:
                assert time.monotonic() < deadline, "the writer did not reconnect"
        assert await changed.wait(WITHIN_S)
