"""Priority classes of requests (docs/scheduling.md).

A request is ``interactive`` (the default) or ``batch``. The class rides on the
request's :class:`~pool.admission.WaitTicket` into the admission store, where the
grant rule ranks interactive waiters first and a batch waiter as interactive once
it has waited ``POOL_BATCH_MAX_WAIT_S`` (:mod:`pool.admission._rule`). Batch requests
get their own, longer queue timeout (``POOL_BATCH_QUEUE_TIMEOUT_S``).
"""

from __future__ import annotations

from .._exceptions import InvalidRequest
from .._settings import PoolSettings
from ..admission import BATCH, PRIORITIES, WaitTicket


def classed_ticket(
    settings: PoolSettings, ticket: WaitTicket | None, priority: str | None
) -> WaitTicket | None:
    """``ticket`` (a new one if needed) with the class ``priority`` (None: keep the
    ticket's) and the pool's aging; :class:`InvalidRequest` for an unknown class."""
    if priority is None and ticket is None:
        return None  # interactive, the coordinator's default
    ticket = WaitTicket() if ticket is None else ticket
    if priority is not None:
        ticket.priority = priority
    if ticket.priority not in PRIORITIES:
        raise InvalidRequest(
            f"priority must be one of {', '.join(PRIORITIES)}, not {ticket.priority!r}"
        )
    ticket.ages_after_s = settings.batch_max_wait_s
    return ticket


def queue_timeout_for(
    settings: PoolSettings, ticket: WaitTicket | None, queue_timeout_s: float | None
) -> float:
    """The queue timeout of a request: its own, else its class's."""
    if queue_timeout_s is not None:
        return queue_timeout_s
    if ticket is not None and ticket.priority == BATCH:
        return settings.batch_queue_timeout_s
    return settings.queue_timeout_s
