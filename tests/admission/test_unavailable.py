"""Fail closed: an unreachable or locked store admits nothing, and service comes back."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import time
import uuid
from pathlib import Path

import pytest

from pool import BusyError
from pool.admission import GLOBAL_RESOURCE, Coordinator, open_coordinator
from tests.chaos._infra import PrivateRedis

from .conftest import Opener
from .helpers import queue

UNAVAILABLE = "coordinator_unavailable"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def busy_reason(coord: Coordinator, *, timeout: float = 0.5) -> str:
    """Try to acquire; return the BusyError reason (fails the test if admitted)."""
    with pytest.raises(BusyError) as caught:
        await coord.acquire([GLOBAL_RESOURCE], timeout=timeout)
    return caught.value.reason


# -- SQLite -----------------------------------------------------------------------------------


async def test_sqlite_locked_beyond_busy_timeout_fails_closed(
    tmp_path: Path, open_store: Opener
) -> None:
    """A write lock held past busy_timeout: BusyError at once, held leases unaffected."""
    path = tmp_path / "deep" / "dir" / "admission.db"
    coord = open_store(f"sqlite:///{path}?busy_timeout_ms=200", lease_ttl_s=1.0)
    await coord.set_limits({GLOBAL_RESOURCE: 2})
    held = await coord.acquire([GLOBAL_RESOURCE], timeout=0)
    kept = await coord.acquire([GLOBAL_RESOURCE], timeout=0)
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        assert await busy_reason(coord) == UNAVAILABLE
        assert time.monotonic() - started < 1.5
        await coord.release(held)  # cannot reach the file: logged, retried, no error
    finally:
        lock.execute("COMMIT")
        lock.close()
    lease = await coord.acquire([GLOBAL_RESOURCE], timeout=3)  # the orphan release lands
    snap = await coord.snapshot()
    assert snap.held == {GLOBAL_RESOURCE: 2} and snap.reachable
    for each in (kept, lease):
        await coord.release(each)


async def test_sqlite_unopenable_file_fails_closed(tmp_path: Path, open_store: Opener) -> None:
    """A file that cannot be created makes admission busy, not an internal error."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    coord = open_store(f"sqlite:///{blocker}/admission.db")
    assert await busy_reason(coord, timeout=0) == UNAVAILABLE
    assert not (await coord.snapshot()).reachable


def test_sqlite_url_must_name_a_file() -> None:
    """Malformed SQLite URLs and unknown options are rejected when the store is opened."""
    for url in ("sqlite://", "sqlite://host/x.db", "sqlite:////tmp/x.db?colour=red"):
        with pytest.raises(ValueError):
            open_coordinator(url)


# -- Redis ------------------------------------------------------------------------------------


async def test_redis_nobody_listening_fails_closed_quickly(open_store: Opener) -> None:
    """No Redis at the address: acquire raises coordinator_unavailable within a second."""
    coord = open_store(f"redis://127.0.0.1:{free_port()}/0?prefix=x:")
    started = time.monotonic()
    assert await busy_reason(coord, timeout=5) == UNAVAILABLE
    assert time.monotonic() - started < 1.0
    with pytest.raises(BusyError):
        await coord.set_limits({GLOBAL_RESOURCE: 1})
    assert not (await coord.snapshot()).reachable


async def test_redis_outage_fails_closed_and_recovers(
    private_redis: PrivateRedis, open_store: Opener
) -> None:
    """Redis dies: busy at once, releases are quiet; it restarts empty: leases are
    re-registered, nothing is over-admitted, and admission and push wake-ups resume."""
    url = f"{private_redis.url}?prefix={uuid.uuid4().hex[:8]}:"
    # TTL 3 s: the outage below (kill, busy, restart) must end before the holder's local
    # expiry (2.4 s), else `kept` is fenced, rightly, instead of re-registered.
    holder = open_store(url, lease_ttl_s=3.0)
    other = open_store(url, lease_ttl_s=3.0)
    pushed = open_store(url + "&poll_ms=60000", lease_ttl_s=3.0)  # wakes by pub/sub only
    await holder.set_limits({GLOBAL_RESOURCE: 2})
    # A server younger than one lease TTL grants nothing yet (quarantine): wait it out.
    kept = await holder.acquire([GLOBAL_RESOURCE], timeout=6)
    dropped = await holder.acquire([GLOBAL_RESOURCE], timeout=1)
    await pushed.shared_secret()  # connected, listener running

    private_redis.kill()
    started = time.monotonic()
    assert await busy_reason(other, timeout=5) == UNAVAILABLE
    assert time.monotonic() - started < 2.0
    await holder.release(dropped)  # logged; the store forgets it anyway

    private_redis.start()  # empty: no limits, no leases
    deadline = time.monotonic() + 12
    while True:
        try:
            admitted = await other.acquire([GLOBAL_RESOURCE], timeout=1)
            break
        except BusyError:
            assert time.monotonic() < deadline, "admission did not resume"
    # `kept` was re-registered by its holder's heartbeat: one slot left, now taken.
    assert (await other.snapshot()).held == {GLOBAL_RESOURCE: 2}
    assert await busy_reason(other, timeout=0.2) == "queue_timeout"

    waiter, _ = await queue(pushed, [GLOBAL_RESOURCE])
    await holder.release(kept)
    lease = await asyncio.wait_for(waiter, 2.0)  # the subscriber reconnected
    for coord, each in ((other, admitted), (pushed, lease)):
        await coord.release(each)
