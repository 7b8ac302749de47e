"""``SharedValues.update``: atomic read-modify-write of shared values, every store."""

from __future__ import annotations

import asyncio

from pool.admission import Coordinator
from tests.admission.conftest import Opener


def _increment(raw: str | None) -> str:
    return str(int(raw or "0") + 1)


async def test_update_creates_changes_and_can_leave_a_value(coord: Coordinator) -> None:
    """Absent → created; None from the function leaves the value; the result is returned."""
    assert await coord.values.update("k", _increment, ttl_s=30) == "1"
    assert await coord.values.update("k", _increment, ttl_s=30) == "2"
    assert await coord.values.update("k", lambda _raw: None, ttl_s=30) == "2"
    assert await coord.values.get("k") == "2"
    assert await coord.values.update("absent", lambda _raw: None, ttl_s=30) is None


async def test_concurrent_updates_from_two_coordinators_lose_nothing(
    shared_url: str, open_store: Opener
) -> None:
    """Two coordinators on one store (as two processes), 2 × 60 concurrent increments:
    the value ends at 120, so no update overwrote another."""
    first, second = open_store(shared_url), open_store(shared_url)
    await asyncio.gather(
        *(c.values.update("n", _increment, ttl_s=30) for c in (first, second) for _ in range(60))
    )
    assert await first.values.get("n") == "120"
    assert await second.values.get("n") == "120"


async def test_an_expired_value_counts_as_absent(coord: Coordinator) -> None:
    """After its TTL the function sees None again."""
    await coord.values.update("short", lambda _raw: "old", ttl_s=0.05)
    await asyncio.sleep(0.2)
    seen: list[str | None] = []

    def record(raw: str | None) -> str:
        seen.append(raw)
        return "new"

    assert await coord.values.update("short", record, ttl_s=30) == "new"
    assert seen[-1] is None
