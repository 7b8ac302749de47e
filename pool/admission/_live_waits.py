"""Admission waits still in progress, so that the dashboard can tell the truth under load.

Percentiles of finished waits say nothing while callers are still queued: ten callers
waiting for seconds showed "p95 0.1 ms" (issue 32). :class:`LiveWaits` notes when each
of this process's waits began (wall clock: the fleet compares them) and forgets it when
the wait ends, however it ends; :class:`WaitingCoordinator` is the coordinator the
request path admits through, noting every ``acquire`` and passing every call on.
Each process publishes its waits with its statistics (pool/_stats.py), and pool-stats
shows the fleet's oldest wait and the p95 of those still queued.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from ._protocol import AdmissionSnapshot, Coordinator, Lease, WaitTicket

if TYPE_CHECKING:
    from ._values import SharedValues

PUBLISHED = 256  # the oldest waits a process publishes (the p95 of a longer queue: of these)


class LiveWaits:
    """This process's waits in progress: when each began (wall-clock seconds)."""

    def __init__(self, wall: Callable[[], float]) -> None:
        self._wall = wall
        self._began: dict[int, float] = {}
        self._ids = itertools.count()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        wait = next(self._ids)
        self._began[wait] = self._wall()
        try:
            yield
        finally:
            del self._began[wait]

    def oldest(self, n: int = PUBLISHED) -> list[float]:
        """When the ``n`` oldest waits began, oldest first."""
        return sorted(self._began.values())[:n]


def summary(began: Sequence[float], now: float) -> dict[str, float | int | None]:
    """``count``, ``oldestMs`` and ``p95Ms`` of the waits that began at ``began``."""
    ages = sorted((max(0.0, now - b) for b in began), reverse=True)
    if not ages:
        return {"count": 0, "oldestMs": None, "p95Ms": None}
    p95 = ages[int(0.05 * len(ages))]  # 95 % of the waits are this young or younger
    return {"count": len(ages), "oldestMs": round(ages[0] * 1000, 1),
            "p95Ms": round(p95 * 1000, 1)}  # fmt: skip


class WaitingCoordinator:
    """``inner`` with each ``acquire`` noted in ``waits`` while it waits."""

    def __init__(self, inner: Coordinator, waits: LiveWaits) -> None:
        self._inner = inner
        self._waits = waits
        self.store = inner.store

    @property
    def values(self) -> SharedValues:
        return self._inner.values

    async def acquire(
        self, resources: Sequence[str], *, timeout: float, ticket: WaitTicket | None = None
    ) -> Lease:
        with self._waits.waiting():
            return await self._inner.acquire(resources, timeout=timeout, ticket=ticket)

    async def release(self, lease: Lease) -> None:
        await self._inner.release(lease)

    async def set_limits(self, limits: dict[str, int]) -> None:
        await self._inner.set_limits(limits)

    async def snapshot(self) -> AdmissionSnapshot:
        return await self._inner.snapshot()

    async def shared_secret(self) -> bytes:
        return await self._inner.shared_secret()

    async def aclose(self) -> None:
        await self._inner.aclose()
