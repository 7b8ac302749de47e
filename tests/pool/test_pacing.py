"""How many of our calls a Space held (issue 31, pool/connections/_pacing.py): from the
Space's own start and completion messages for a floor (may read low, never high), and
from our joins for a cap (may read high, never low)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pool.connections._pacing import GRACE_S, JoinPacer


class _Call:
    """What the pacer reads of a call: its result and when its start reached us."""

    def __init__(self) -> None:
        self.result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.started_at: float | None = None


async def _end(call: _Call) -> None:
    call.result.set_result(None)
    await asyncio.sleep(0)  # the pacer's done callback runs


async def test_a_call_that_ended_as_another_started_is_not_counted_beside_it() -> None:
    """A's completion reached us just after B's start (two streams' messages crossed):
    B ran with no other of ours; C started while B ran: 2."""
    pacer = JoinPacer()
    a, b, c = _Call(), _Call(), _Call()
    for call in (a, b, c):
        pacer.joined(call)  # type: ignore[arg-type]
    now = time.monotonic()
    a.started_at, b.started_at = now - 1.0, now - GRACE_S / 5
    await _end(a)
    c.started_at = time.monotonic()
    await asyncio.sleep(GRACE_S * 2)
    await _end(c)
    await _end(b)
    assert [pacer.ran_with(x) for x in (a, b, c)] == [1, 1, 2]  # type: ignore[arg-type]


async def test_a_cap_counts_every_call_sent_until_the_call_started() -> None:
    """F was sent first, G and H after it, and H reached the Space before F: F waited
    with 3 of ours there though it counted 1 when sent."""
    pacer = JoinPacer()
    f, g, h, i = _Call(), _Call(), _Call(), _Call()
    assert pacer.joined(f) == 1  # type: ignore[arg-type]
    pacer.joined(g)  # type: ignore[arg-type]
    pacer.joined(h)  # type: ignore[arg-type]
    f.started_at = time.monotonic()
    pacer.joined(i)  # type: ignore[arg-type]
    for call in (f, g, h, i):
        await _end(call)
    assert [pacer.held_with(x) for x in (f, g, h, i)] == [3, 4, 4, 4]  # type: ignore[arg-type]
    assert pacer.running == 0
