"""The per-caller stream count gives every stream back, however it ends (issue 38):
exhausted, failed, closed — and dropped before its first item, as a response is when its
client is gone before the first byte (before: such a stream was counted for ever)."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator

import pytest

from app.core import StreamCaps


async def _items(n: int, fail: bool = False) -> AsyncIterator[int]:
    for i in range(n):
        yield i
    if fail:
        raise RuntimeError("the stream's source failed")


async def test_every_way_a_stream_ends_gives_it_back() -> None:
    caps = StreamCaps(limit=2)
    done = caps.take("a").over(_items(2))
    assert [i async for i in done] == [0, 1]
    assert caps.open("a") == 0  # exhausted

    failed = caps.take("a").over(_items(1, fail=True))
    with pytest.raises(RuntimeError):
        async for _ in failed:
            pass
    assert caps.open("a") == 0  # failed

    closed = caps.take("a").over(_items(5))
    assert await anext(closed) == 0
    await closed.aclose()  # type: ignore[attr-defined]  # an AsyncIterator by type
    assert caps.open("a") == 0  # closed mid-way

    dropped = caps.take("a").over(_items(5))
    assert caps.open("a") == 1
    del dropped
    gc.collect()
    assert caps.open("a") == 0  # never started, dropped

    never_wrapped = caps.take("a")
    never_wrapped.release()
    never_wrapped.release()  # given back once, not twice
    assert caps.open("a") == 0


async def test_the_limit_counts_per_identity() -> None:
    caps = StreamCaps(limit=1)
    held = caps.take("a")
    with pytest.raises(Exception, match="open streams"):
        caps.take("a")
    caps.take("b").release()  # another identity is not touched
    held.release()
    caps.take("a").release()
