"""A Redis process with many entries: no script runs over all of them (issue 39, item 6).
Its restore after a store reset and its close go a chunk of ids per script run, and
every entry is back (or gone) all the same."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pool.admission import open_coordinator

from .conftest import drop_prefix, make_url
from .helpers import GLOBAL, until_async

WAITERS = 600  # more than two chunks of 256


async def test_restore_and_close_go_in_chunks(tmp_path: Path) -> None:
    """600 waiters of one process: after the store forgets them they are all
    re-registered (in chunks of 256), and the process's close drops them all."""
    url = next(iter(make_url("redis", tmp_path)))
    prefix = url.partition("prefix=")[2].partition("&")[0]
    coord = open_coordinator(url, lease_ttl_s=30)
    watcher = open_coordinator(url, lease_ttl_s=30)
    tasks: list[asyncio.Task[object]] = []
    try:
        await coord.set_limits({GLOBAL: 1})
        held = await coord.acquire([GLOBAL, "space:a"], timeout=5)
        tasks = [
            asyncio.create_task(coord.acquire([GLOBAL, "space:a"], timeout=60))
            for _ in range(WAITERS)
        ]

        async def all_queued() -> bool:
            return (await watcher.snapshot()).waiting == WAITERS

        await until_async(all_queued, what="600 waiters in the store")
        drop_prefix(prefix)  # the store forgets everything (a reset)
        # The holder's next call meets a new epoch and re-registers, chunk by chunk.
        await coord.release(held)
        snap = await watcher.snapshot()
        assert snap.waiting == WAITERS, snap
        assert not any(t.done() for t in tasks)
        await coord.aclose()  # the waiters are dropped from the store, 256 ids per run
        assert (await watcher.snapshot()).waiting == 0
    finally:
        await coord.aclose()
        await asyncio.gather(*tasks, return_exceptions=True)
        await watcher.aclose()
        drop_prefix(prefix)
