"""Admission: all-or-nothing FIFO leases over shared resources, behind one protocol.

Its face also carries what goes with a lease: the consumer a call is admitted for
(``Consumer``, ``CURRENT``, ``identity``…, from the ground's :mod:`pool._consumer`), the
one ownership mechanism of leases and durable jobs (``Holder``, ``Owners``,
``write_fenced``…), watched shared values (``Changed``) and the waits in progress for
pool-stats (``LiveWaits``).
"""

from __future__ import annotations

from collections.abc import Callable

from .._consumer import CURRENT, PSEUDONYMOUS, Consumer, anonymous_of, current, identity
from ._live_waits import LiveWaits, WaitingCoordinator, summary
from ._memory import MemoryCoordinator
from ._ownership import Heartbeat, Holder, Owners, reclaimable, taken_over, write_fenced
from ._protocol import AdmissionSnapshot, Coordinator, Lease, WaitTicket, new_id
from ._rule import (
    BATCH,
    CONSUMER_PREFIX,
    GLOBAL_RESOURCE,
    INTERACTIVE,
    PRIORITIES,
    SPACE_PREFIX,
    plan_grants,
)
from ._store_layout import StoreRefused
from ._values import SharedValues
from ._watch import Changed

_REDIS_SCHEMES = {
    "redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel",
    "rediss+sentinel",
}  # fmt: skip


def open_coordinator(
    url: str,
    *,
    lease_ttl_s: float = 15.0,
    ca_file: str | None = None,
    allow_evicting_store: bool = False,
    clock: Callable[[], float] | None = None,
) -> Coordinator:
    """The store named by ``url``: ``memory://``, ``sqlite:///path`` or Redis:
    ``redis://…``, ``rediss://…`` (TLS; ``ca_file``: its certificate authority),
    ``redis+cluster://host:port[,host:port]/``, ``redis+sentinel://host:port[,…]/service/db``
    (docs/leases.md, Stores). ``clock``: the memory store's clock for its values' TTLs (a
    pool's, which tests may drive); the shared stores keep time on their own clock."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "memory":
        return MemoryCoordinator() if clock is None else MemoryCoordinator(clock=clock)
    if scheme == "sqlite":
        from ._sqlite import SQLiteCoordinator

        return SQLiteCoordinator(url, lease_ttl_s=lease_ttl_s)
    if scheme in _REDIS_SCHEMES:
        from ._redis import RedisCoordinator

        return RedisCoordinator(
            url, lease_ttl_s=lease_ttl_s, ca_file=ca_file,
            allow_evicting_store=allow_evicting_store,
        )  # fmt: skip
    raise ValueError(f"unsupported POOL_COORDINATOR_URL scheme {scheme!r}")


__all__ = [
    "BATCH",
    "CONSUMER_PREFIX",
    "CURRENT",
    "GLOBAL_RESOURCE",
    "INTERACTIVE",
    "PRIORITIES",
    "PSEUDONYMOUS",
    "SPACE_PREFIX",
    "AdmissionSnapshot",
    "Changed",
    "Consumer",
    "Coordinator",
    "Heartbeat",
    "Holder",
    "Lease",
    "LiveWaits",
    "MemoryCoordinator",
    "Owners",
    "SharedValues",
    "StoreRefused",
    "WaitTicket",
    "WaitingCoordinator",
    "anonymous_of",
    "current",
    "identity",
    "new_id",
    "open_coordinator",
    "plan_grants",
    "reclaimable",
    "summary",
    "taken_over",
    "write_fenced",
]
