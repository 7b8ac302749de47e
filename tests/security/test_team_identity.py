"""Identity is (key, user) in the library (issue 38, F1 and F2): a pool's sessions and
holdings under API keys' consumers (pool/_consumer.py), over the stand-in fleet."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from devspaces import SpaceFleet
from pool import SessionNotFound, UserLimitReached
from pool._consumer import CURRENT, Consumer
from tests.conftest import PoolMaker

T = TypeVar("T")
A = Consumer("team-a", "a1b2c3d4e5f60718")
B = Consumer("team-b", "0f1e2d3c4b5a6978")


async def as_key(consumer: Consumer | None, work: Callable[[], Awaitable[T]]) -> T:
    """``work`` run as ``consumer``'s call (what the service does for a request)."""
    token = CURRENT.set(consumer)
    try:
        return await work()
    finally:
        CURRENT.reset(token)


async def test_f1_an_email_holding_a_key_id_is_not_that_keys_user(
    spaces: SpaceFleet, make_pool: PoolMaker
) -> None:
    """A's bob and ``"<A's id>/bob"`` sent without a key hash apart, so the latter
    neither reads nor ends bob's session (before: one hash, bob's session read)."""
    pool = make_pool(spaces, min_connections=1)
    await pool.start()
    bob = "bob@corp.example"
    forged = f"{A.key_id}/{bob}"
    keyed = await as_key(A, lambda: pool.open_session(bob, "alpha"))
    assert await as_key(A, lambda: pool.get_session(keyed, bob))
    token = CURRENT.set(A)
    try:
        bobs = pool.hash_user(bob)
    finally:
        CURRENT.reset(token)
    assert bobs != pool.hash_user(forged)
    with pytest.raises(SessionNotFound):
        await pool.get_session(keyed, forged)
    with pytest.raises(SessionNotFound):
        await pool.close_session(keyed, forged)
    with pytest.raises(SessionNotFound):  # and B's bob is not A's either
        await as_key(B, lambda: pool.get_session(keyed, bob))


async def test_f2_each_keys_anonymous_callers_are_its_own(
    spaces: SpaceFleet, make_pool: PoolMaker
) -> None:
    """A's anonymous session is unknown to B's anonymous callers and to callers without
    a key; B at its anonymous sessions' limit does not refuse A's (before: one user)."""
    pool = make_pool(spaces, min_connections=1)
    await pool.start()
    mine = await as_key(A, lambda: pool.open_session(None, "alpha", limit=1))
    for other in (B, None):
        with pytest.raises(SessionNotFound):
            await as_key(other, lambda: pool.get_session(mine, None))
    await as_key(B, lambda: pool.open_session(None, "alpha", limit=1))
    with pytest.raises(UserLimitReached):
        await as_key(B, lambda: pool.open_session(None, "alpha", limit=1))
    with pytest.raises(UserLimitReached):  # A's own limit still holds for A
        await as_key(A, lambda: pool.open_session(None, "beta", limit=1))
    await as_key(None, lambda: pool.open_session(None, "beta", limit=1))
    await as_key(A, lambda: pool.close_session(mine, None))
    await as_key(A, lambda: pool.open_session(None, "beta", limit=1))
