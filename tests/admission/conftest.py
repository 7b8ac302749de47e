"""Fixtures: one coordinator per store (memory, SQLite file, private Redis prefix).

Redis tests use the server at ``SPACEPOOL_TEST_REDIS`` (default
``redis://127.0.0.1:6379/0``) under a prefix unique to the test, deleted afterwards.
Without that server they are skipped with the reason, except when ``CI`` is set:
there a missing Redis fails the run.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import redis

from pool.admission import Coordinator, open_coordinator
from tests.chaos._infra import private_redis  # noqa: F401  (a fixture, shared)

REDIS_URL = os.environ.get("SPACEPOOL_TEST_REDIS", "redis://127.0.0.1:6379/0")
STORES = ("memory", "sqlite", "redis")
SHARED_STORES = ("sqlite", "redis")
LEASE_TTL_S = 2.0


def require_redis() -> None:
    """Skip (locally) or fail (CI) when the test Redis does not answer."""
    try:
        with redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=1) as r:
            r.ping()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        message = f"Redis at {REDIS_URL} unreachable ({exc}); start redis-server"
        if os.environ.get("CI"):
            pytest.fail(message + " — CI runs the Redis tests, they may not skip")
        pytest.skip(message)


def drop_prefix(prefix: str) -> None:
    """Delete every key under ``prefix`` in the test Redis."""
    with redis.Redis.from_url(REDIS_URL) as r:
        keys = list(r.scan_iter(match=prefix + "*", count=500))
        if keys:
            r.delete(*keys)


def make_url(kind: str, tmp_path: Path, name: str = "admission") -> Iterator[str]:
    """A fresh store of ``kind``: a new file, or a new Redis prefix removed afterwards."""
    if kind == "memory":
        yield "memory://"
    elif kind == "sqlite":
        yield f"sqlite:///{tmp_path}/{name}/{name}.db"
    else:
        require_redis()
        prefix = f"spacepool-test:{uuid.uuid4().hex[:12]}:"
        # 10 s, not the store's 1 s socket timeout: on a loaded 2-core CI box a client's
        # loop can stall past 1 s (GIL held by Client threads; once past 3 s, with Redis's
        # SLOWLOG empty), and these tests are not about timeouts (tests/chaos and
        # test_unavailable are, with their own URLs).
        yield f"{REDIS_URL}?prefix={prefix}&timeout_ms=10000"
        drop_prefix(prefix)


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A private key prefix on the test Redis, deleted afterwards."""
    require_redis()
    prefix = f"spacepool-test:{uuid.uuid4().hex[:12]}:"
    yield prefix
    drop_prefix(prefix)


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh store, once per store kind."""
    yield from make_url(request.param, tmp_path)


@pytest.fixture(params=SHARED_STORES)
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh store that several processes can share."""
    yield from make_url(request.param, tmp_path)


Opener = Callable[..., Coordinator]


@pytest.fixture
async def open_store() -> AsyncIterator[Opener]:
    """``open_store(url, lease_ttl_s=...)``: coordinators closed at the end of the test."""
    opened: list[Coordinator] = []

    def opener(url: str, *, lease_ttl_s: float = LEASE_TTL_S) -> Coordinator:
        coordinator = open_coordinator(url, lease_ttl_s=lease_ttl_s)
        opened.append(coordinator)
        return coordinator

    yield opener
    for coordinator in reversed(opened):
        await coordinator.aclose()


@pytest.fixture
async def coord(store_url: str, open_store: Opener) -> Coordinator:
    """A coordinator on a fresh store, closed at the end of the test."""
    return open_store(store_url)
