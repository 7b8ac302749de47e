"""The coordinator protocol: one interface, three stores (memory, SQLite, Redis).

A coordinator holds, for a whole fleet of processes, the resources' limits, the
leases granted on them and the FIFO list of waiters. :func:`open_coordinator` picks
the store from ``POOL_COORDINATOR_URL``. Every store applies the same grant rule
(:mod:`pool.admission._rule`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .._exceptions import MisuseError


@dataclass
class WaitTicket:
    """Live view of one waiter, updated by the store while it waits."""

    position: int = 0
    estimate_s: float = 0.0
    enqueued_at: float = field(default_factory=time.monotonic)
    stage: str = "queued"  # "waking" while the pool waits for a sleeping Space to start
    space: str | None = None  # the Space being woken


class Lease:
    """An owned grant of one slot on each of ``resources``; release it exactly once."""

    __slots__ = ("_released", "granted_at", "lease_id", "resources")

    def __init__(self, lease_id: str, resources: tuple[str, ...]) -> None:
        self.lease_id = lease_id
        self.resources = resources
        self.granted_at = time.monotonic()
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def mark_released(self) -> None:
        """Flip to released; a second call is a programming error."""
        if self._released:
            raise MisuseError(f"lease {self.lease_id} released twice")
        self._released = True

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<Lease {self.lease_id[:8]} {','.join(self.resources)} {state}>"


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class AdmissionSnapshot:
    """What the store knows, fleet-wide: per resource holders, waiters and limits."""

    held: dict[str, int]
    queued: dict[str, int]
    limits: dict[str, int]
    waiting: int
    store: str
    reachable: bool = True


class Coordinator(Protocol):
    """What the pool needs from an admission store."""

    store: str

    async def acquire(
        self, resources: Sequence[str], *, timeout: float, ticket: WaitTicket | None = None
    ) -> Lease:
        """Wait (FIFO, bounded by ``timeout``) until every resource has a slot for us.

        Raises :class:`~pool.BusyError` with the position held at expiry.
        Cancellation removes the waiter; a slot granted to a cancelled waiter is
        passed on.
        """
        ...

    async def release(self, lease: Lease) -> None:
        """Return every slot of ``lease`` and wake whoever can now be admitted."""
        ...

    async def set_limits(self, limits: dict[str, int]) -> None:
        """Set limits for named resources or prefixes (``"consumer:"``); at once."""
        ...

    async def snapshot(self) -> AdmissionSnapshot: ...

    async def put_value(self, key: str, value: str, ttl_s: float) -> None:
        """Store a small value for every process to read, expiring after ``ttl_s``."""
        ...

    async def get_value(self, key: str) -> str | None:
        """The live value under ``key``, or None."""
        ...

    async def values(self, prefix: str) -> dict[str, str]:
        """Every live value whose key starts with ``prefix``."""
        ...

    async def delete_value(self, key: str) -> None: ...

    async def update_value(
        self, key: str, update: Callable[[str | None], str | None], ttl_s: float
    ) -> str | None:
        """Atomically replace the value under ``key`` with ``update(current)``.

        ``update`` is a pure function (no I/O: it may run more than once when another
        process writes the key at the same moment); returning None leaves the value as
        it is. Returns the value stored afterwards (None if there is none).
        """
        ...

    async def shared_secret(self) -> bytes:
        """A random key shared by every process on this store (keys user hashes)."""
        ...

    async def aclose(self) -> None:
        """Release every lease this process holds and stop background work."""
        ...
