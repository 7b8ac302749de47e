"""A late command cannot act (issue 22): a stale enqueue or restore replayed after
its waiter was withdrawn, released or expired is refused, on Redis and on SQLite.

The store calls are made on the coordinator's own store object, as a command that
its client abandoned on timeout would reach the server: the same operation, the same
id, after the operations that followed it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pool.admission import Coordinator
from pool.admission._protocol import new_id

from .conftest import Opener
from .helpers import GLOBAL


def _store(coord: Coordinator) -> Any:
    return coord._backend  # type: ignore[attr-defined]  # the store under the keeper


async def _nothing_held(coord: Coordinator) -> None:
    snap = await coord.snapshot()
    assert snap.held == {} and snap.waiting == 0, snap


async def test_late_enqueue_after_its_withdraw_is_refused(
    shared_url: str, open_store: Opener
) -> None:
    """An enqueue delivered after the withdraw of its id (sent on a new connection)
    neither queues nor takes a slot: the next caller is admitted at once."""
    coord = open_store(shared_url)
    await coord.set_limits({GLOBAL: 1})
    store, key = _store(coord), new_id()
    await store.withdraw(key, keep=False)  # the withdraw arrives first...
    view = await store.enqueue(key, (GLOBAL,))  # ...then the abandoned enqueue
    assert not view.granted and not view.positions
    await _nothing_held(coord)
    lease = await coord.acquire([GLOBAL], timeout=1)
    await coord.release(lease)


async def test_late_enqueue_after_release_or_queue_withdraw_is_refused(
    shared_url: str, open_store: Opener
) -> None:
    """A granted-then-released id and a queued-then-withdrawn id stay refused, and a
    stale re-registration (restore) of either does not bring it back."""
    coord = open_store(shared_url)
    await coord.set_limits({GLOBAL: 1})
    store, first, second = _store(coord), new_id(), new_id()
    assert first in (await store.enqueue(first, (GLOBAL,))).granted
    assert (await store.enqueue(second, (GLOBAL,))).positions.get(second) == 1
    await store.withdraw(second, keep=False)
    await store.release(first, 0.1)
    for key in (first, second):
        view = await store.enqueue(key, (GLOBAL,))
        assert not view.granted and not view.positions
    await _nothing_held(coord)


async def test_late_enqueue_after_expiry_is_refused(shared_url: str, open_store: Opener) -> None:
    """A lease nobody renewed expires; its id replayed later is refused, not granted."""
    coord = open_store(shared_url, lease_ttl_s=0.3)
    await coord.set_limits({GLOBAL: 1})
    store, key = _store(coord), new_id()
    assert key in (await store.enqueue(key, (GLOBAL,))).granted  # not renewed: it expires
    await asyncio.sleep(0.4)
    await _nothing_held(coord)  # the snapshot's pass reclaimed it
    await store.poll([key])  # a write pass (reclaim) on either store
    view = await store.enqueue(key, (GLOBAL,))
    assert not view.granted and not view.positions
    await _nothing_held(coord)
