"""The native transport's connections to a Space: kept alive across busy calls, and the
heartbeat stream opened only by a session whose call needs it (gr.State)."""

from __future__ import annotations

import asyncio

from devspaces import SpaceFleet
from pool import Pool, PoolSettings

from .test_native import recording

ROUNDS, AT_ONCE = 3, 4


async def test_busy_sessions_reuse_their_tcp_connections_and_stateless_calls_open_no_heartbeat(
    fleet: SpaceFleet,
) -> None:
    """Rounds of 4 calls at once on 4 pooled connections: after the first round no new
    TCP connection reaches the Space (the keep-alive cap once closed all but 3, and
    each lease held a heartbeat stream of its own); /echo touches no gr.State, so no
    heartbeat is opened until a /state call asks for one."""
    async with recording(fleet["alpha"].url) as (rec, url):
        pool = Pool(PoolSettings(spaces=f"alpha={url}", coordinator_url="memory://",
                                 min_connections=1, max_connections=AT_ONCE))  # fmt: skip
        try:
            rounds: list[int] = []
            for r in range(ROUNDS):
                rounds.append(len(rec.seen))
                await asyncio.gather(*(pool.predict("/echo", f"{r}.{i}", 0.3, email=f"u{i}@x.y")
                                       for i in range(AT_ONCE)))  # fmt: skip
            stateless = len(rec.seen)
            await pool.predict("/state", "v", email="s@x.y")
            await asyncio.sleep(0.2)  # the session's heartbeat request goes out
        finally:
            await pool.aclose()
    first = set(rec.ports[: rounds[1]])
    later = set(rec.ports[rounds[1] : stateless])
    assert len(later - first) <= 1, (len(first), sorted(later - first))
    assert not [p for _, p, _ in rec.seen[:stateless] if "/heartbeat/" in p]
    assert [p for _, p, _ in rec.seen[stateless:] if "/heartbeat/" in p]
