"""Sessions through the library: a gr.ChatInterface keeps its history across calls of
one session, sessions never see each other's, nothing is held between turns, and a
deleted or expired session is not found (a restarted one: tests/service/test_sessions.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devspaces import SpaceProcess
from pool import Pool, PoolSettings, SessionNotFound


@pytest.fixture
async def pool(talk: SpaceProcess, tmp_path: Path) -> AsyncIterator[Pool]:
    """A pool over the chat Space (a real gr.ChatInterface), sessions in SQLite."""
    p = Pool(
        PoolSettings(
            spaces=f"talk={talk.url}", coordinator_url=f"sqlite:///{tmp_path / 'c.db'}",
            min_connections=1,
            session_idle_s=60.0,
        )
    )  # fmt: skip
    await p.start()
    yield p
    await p.aclose()


async def test_a_session_keeps_the_chat_history_and_two_sessions_stay_apart(pool: Pool) -> None:
    """Three interleaved turns of two sessions: each reply names that session's earlier
    messages only; between turns nothing is in use; a call without a session has none."""
    a = await pool.open_session("ann@example.com")
    b = await pool.open_session(None)
    assert a.space == b.space == "" and a.id != b.id, "unpinned until the first call"
    for turn in ("one", "two", "three"):
        for who, session in (("a", a), ("b", b)):
            done = await pool.predict("/chat", f"{who}-{turn}",
                                      email="ann@example.com" if who == "a" else None,
                                      session=session)  # fmt: skip
            assert done.space == "talk"
        stats = await pool.stats()
        assert stats["inUseConnections"] == 0 and stats["admission"]["globalInUse"] == 0
    assert done.result.endswith("earlier: b-one | b-two")
    assert (await pool.get_session(a, "ann@example.com")).space == "talk", "pinned by a call"
    last_a = await pool.predict("/chat", "a-four", email="ann@example.com", session=a.id)
    assert last_a.result.endswith("earlier: a-one | a-two | a-three")
    plain = await pool.predict("/chat", "alone")
    assert plain.result.endswith("earlier: (nothing)")


async def test_calls_of_one_session_at_once_each_get_their_own_reply(pool: Pool) -> None:
    """Two calls of one session at once, on two connections: each answered with its
    own reply (they share the upstream session's one data stream)."""
    s = await pool.open_session(None)
    first, second = await asyncio.gather(pool.predict("/chat", "x-one", session=s),
                                         pool.predict("/chat", "x-two", session=s))  # fmt: skip
    assert "heard 'x-one'" in first.result and "heard 'x-two'" in second.result


async def test_only_its_owner_may_use_a_session_and_a_deleted_one_is_gone(pool: Pool) -> None:
    """Another email, no email, or a deleted session: SessionNotFound, before any slot."""
    s = await pool.open_session("owner@example.com")
    for email in ("other@example.com", None):
        with pytest.raises(SessionNotFound):
            await pool.predict("/chat", "x", email=email, session=s)
    await pool.sessions.close(s, "owner@example.com")
    with pytest.raises(SessionNotFound):
        await pool.predict("/chat", "x", email="owner@example.com", session=s)
    assert (await pool.stats())["admission"]["globalInUse"] == 0


async def test_a_session_expires_after_its_idle_time_and_a_call_renews_it(pool: Pool) -> None:
    """POOL_SESSION_IDLE_S=2: calls 0.3 s apart keep it for longer than that; left
    alone it ends (SessionNotFound), not before its idle time (polled, not timed)."""
    pool.settings.session_idle_s = 2.0
    s = await pool.open_session(None)
    kept_from = time.monotonic()
    for _ in range(8):
        await asyncio.sleep(0.3)
        last_call = time.monotonic()  # the call renews the session as it starts
        await pool.predict("/chat", "still here", session=s)
    assert time.monotonic() - kept_from > 2.0
    while True:  # bounded polling: expiry is the store's, not a timer of ours
        try:
            await pool.sessions.get(s, None)
        except SessionNotFound:
            break
        assert time.monotonic() - last_call < 30, "the session never expired"
        await asyncio.sleep(0.1)
    assert time.monotonic() - last_call >= 1.9
