"""The coordinator protocol: one interface, three stores (memory, SQLite, Redis).

A coordinator holds, for a whole fleet of processes, the resources' limits, the
leases granted on them and the FIFO list of waiters. :func:`open_coordinator` picks
the store from ``POOL_COORDINATOR_URL``. Every store applies the same grant rule
(:mod:`pool.admission._rule`). Each also keeps the fleet's shared values, behind their
own protocol (:class:`~pool.admission._values.SharedValues`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .._exceptions import LeaseLost, MisuseError

if TYPE_CHECKING:
    from ._values import SharedValues

_log = logging.getLogger("spacepool.admission")


@dataclass
class WaitTicket:
    """Live view of one waiter, updated by the store while it waits.

    Its writers change it through :meth:`update`; a reader awaits :meth:`changed`
    instead of looking at it on a timer.
    """

    position: int = 0
    estimate_s: float = 0.0
    enqueued_at: float = field(default_factory=time.monotonic)
    stage: str = "queued"  # "waking" while the pool waits for a sleeping Space to start
    space: str | None = None  # the Space being woken
    # Scheduling class (docs/scheduling.md): "interactive" or "batch". A batch waiter
    # ranks as interactive once it has waited ``ages_after_s``.
    priority: str = "interactive"
    ages_after_s: float = 60.0
    _changed: asyncio.Event | None = field(default=None, repr=False, compare=False)

    def update(self, **changes: object) -> None:
        """Set fields (``position``, ``estimate_s``, ``stage``, ``space``); wakes the
        readers waiting in :meth:`changed` when any value differs."""
        differ = False
        for name, value in changes.items():
            if getattr(self, name) != value:
                setattr(self, name, value)
                differ = True
        if differ and self._changed is not None:
            self._changed.set()
            self._changed = None

    async def changed(self) -> None:
        """Return at the ticket's next change (of any field set by :meth:`update`)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()

    def parts(self, count: int) -> list[WaitTicket]:
        """Tickets for one waiter queued for several Spaces at once (late binding,
        pool/_attempt.py): each has this ticket's class, aging and arrival; this ticket
        shows the best position and estimate among them."""
        parts: list[WaitTicket] = []
        for _ in range(count):
            part = _Part(enqueued_at=self.enqueued_at, priority=self.priority,
                         ages_after_s=self.ages_after_s)  # fmt: skip
            part.whole, part.siblings = self, parts
            parts.append(part)
        return parts


class _Part(WaitTicket):
    """One of :meth:`WaitTicket.parts`: its changes reach the whole ticket."""

    whole: WaitTicket
    siblings: list[WaitTicket]

    def update(self, **changes: object) -> None:
        super().update(**changes)
        placed = [t for t in self.siblings if t.position > 0] or self.siblings
        self.whole.update(
            position=min(t.position for t in placed),
            estimate_s=min(t.estimate_s for t in placed),
        )


class Lease:
    """An owned grant of one slot on each of ``resources``; release it exactly once.

    A lease of a shared store also has a *local expiry* (``expires_at``, on
    ``time.monotonic()``): the moment by which the store's copy may have expired,
    pushed back by every successful renewal. Past it, or once the store reports it
    gone, the lease is *lost* (:meth:`fence`): its holder must stop the work it
    covers; callbacks registered with :meth:`on_lost` do that. A memory lease never
    expires.

    Renewals are per process, not per lease: a lease's local expiry is the later of
    its own (from the store call that queued it) and its process's (``shared``: the
    last renewal of the process's liveness), so that one renewal pushes back every
    lease of the process at once.
    """

    __slots__ = (
        "_on_lost", "_own_expiry", "_released", "_shared", "granted_at", "lease_id", "lost",
        "resources", "retry_after_s",
    )  # fmt: skip

    def __init__(
        self,
        lease_id: str,
        resources: tuple[str, ...],
        *,
        expires_at: float = math.inf,
        shared: Liveness | None = None,
    ) -> None:
        self.lease_id = lease_id
        self.resources = resources
        self.granted_at = time.monotonic()
        self._own_expiry = expires_at
        self._shared = shared
        self.lost: LeaseLost | None = None
        self.retry_after_s = 1.0  # what a LeaseLost of this lease tells the caller
        self._released = False
        self._on_lost: list[Callable[[LeaseLost], None]] = []

    @property
    def expires_at(self) -> float:
        """The local expiry (``time.monotonic()``): its own, or its process's if later."""
        shared = self._shared
        if shared is None or shared.expires_at <= self._own_expiry:
            return self._own_expiry
        return shared.expires_at

    @expires_at.setter
    def expires_at(self, value: float) -> None:
        self._own_expiry = value

    @property
    def released(self) -> bool:
        return self._released

    def mark_released(self) -> None:
        """Flip to released; a second call is a programming error."""
        if self._released:
            raise MisuseError(f"lease {self.lease_id} released twice")
        self._released = True

    def on_lost(self, callback: Callable[[LeaseLost], None]) -> None:
        """Call ``callback(error)`` when the lease is lost (at once if it already is)."""
        if self.lost is not None:
            callback(self.lost)
        else:
            self._on_lost.append(callback)

    def fence(self, why: str) -> bool:
        """Mark the lease lost and run the callbacks (no await); False if it already was."""
        if self.lost is not None or self._released:
            return False
        self.lost = LeaseLost(
            f"admission lease {self.lease_id[:8]} lost ({why}); its work was stopped",
            why=why,
            retry_after_s=self.retry_after_s,
        )
        _log.error("lease %s lost (%s): fencing its work", self.lease_id[:8], why)
        callbacks, self._on_lost = self._on_lost, []
        for callback in callbacks:
            try:
                callback(self.lost)
            except Exception:
                _log.exception("lease-lost callback failed")
        return True

    def check(self) -> None:
        """Raise :class:`~pool.LeaseLost` if the lease is lost or past its local expiry
        (fencing it then): the test made before any work under it goes on."""
        if self.lost is None and time.monotonic() >= self.expires_at:
            self.fence("expired")
        if self.lost is not None:
            raise LeaseLost(str(self.lost), why=self.lost.why, retry_after_s=self.retry_after_s)

    def __repr__(self) -> str:
        state = "released" if self._released else "lost" if self.lost else "held"
        return f"<Lease {self.lease_id[:8]} {','.join(self.resources)} {state}>"


class Liveness:
    """One process's renewed liveness, shared by its leases (:class:`Lease`)."""

    __slots__ = ("expires_at",)

    def __init__(self) -> None:
        self.expires_at = -math.inf  # local expiry of whatever the last renewal covered


class StoreUnavailable(Exception):
    """The store did not answer (down, locked, timed out); stores map their errors here."""


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
    batch_waiting: int = 0  # of ``waiting``, the batch class (the rest: interactive)


class Coordinator(Protocol):
    """What the pool needs from an admission store.

    ``values`` are the same store's shared values (:mod:`pool.admission._values`),
    kept apart from admission: reading or writing them never slows an acquire.
    """

    store: str

    @property
    def values(self) -> SharedValues: ...

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

    async def shared_secret(self) -> bytes:
        """A random key shared by every process on this store (keys user hashes)."""
        ...

    async def aclose(self) -> None:
        """Release every lease this process holds and stop background work."""
        ...
