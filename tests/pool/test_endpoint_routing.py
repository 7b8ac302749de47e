"""Spaces of different kinds behind one pool: a call goes where its endpoint is."""

from __future__ import annotations

import pytest

from devspaces import SpaceFleet, SpaceProcess
from pool import Pool, PoolSettings, UnknownEndpoint


async def test_calls_go_only_to_spaces_that_have_their_endpoint(
    clean_fleet: SpaceFleet, stream_spaces: dict[str, SpaceProcess]
) -> None:
    """alpha (echo) and streamer (echo + stream): /stream always runs on streamer, even
    for a user pinned to alpha and before either API is known; /echo runs on both; an
    endpoint no Space has is UnknownEndpoint, with no slot taken."""
    alpha, streamer = clean_fleet["alpha"], stream_spaces["streamer"]
    pool = Pool(
        PoolSettings(
            spaces=f"alpha={alpha.url},streamer={streamer.url}",
            coordinator_url="memory://",
            min_connections=1,
        )
    )
    try:
        await pool.start()
        pinned = "pinned@example.com"
        await pool.router.claim(pool.hash_user(pinned) or "", "alpha")
        first = await pool.predict("/stream", "s", 2, 0.0, email=pinned)
        assert first.space == "streamer" and first.result["text"] == "s0 s1"
        for i in range(4):
            done = await pool.predict("/stream", f"t{i}", 1, 0.0)
            assert (done.space, done.result["text"]) == ("streamer", f"t{i}0")
        echoed = {(await pool.predict("/echo", "e", 0, email=f"u{i}@x.org")).space
                  for i in range(8)}  # fmt: skip
        assert echoed == {"alpha", "streamer"}
        with pytest.raises(UnknownEndpoint, match="/nope") as caught:
            await pool.predict("/nope", "x")
        assert "/stream" in caught.value.available and "/echo" in caught.value.available
        stats = await pool.stats()
        assert stats["admission"]["globalInUse"] == 0 and stats["inUseConnections"] == 0
    finally:
        await pool.aclose()
