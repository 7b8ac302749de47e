"""The front's own refusals, and what an event that could not run tells its client.

:class:`FrontBusy` and :class:`NotYours` are answered by the routes (503 with
``Retry-After``, 404); :class:`FrontUnavailable` is the 501 of a Space the native
transport does not speak. :func:`failure` is the ``process_completed`` error of an event
stopped before the Space ran it.
"""

from __future__ import annotations

from pool import BusyError, PoolError, UpstreamTransportError

from ..core import AuthError


class FrontUnavailable(Exception):
    """The Space's connection is not on the native transport (POOL_TRANSPORT)."""


class FrontBusy(Exception):
    """Too many front sessions open (in all, of one user, or running on one Space):
    the clients' busy answer, with ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NotYours(Exception):
    """A session hash in use by another user: answered as an unknown session."""


def refused(exc: BaseException) -> bool:
    """The Space refused the event before running it for want of room (its own queue
    full, or the front's share of its connections taken): it waits in the pool's queue
    again (the pool's rule: ``RetryPolicy.should_requeue``)."""
    if isinstance(exc, UpstreamTransportError):
        return exc.kind == "queue_full"
    return isinstance(exc, FrontBusy) or (type(exc) is BusyError and exc.reason == "no_room")


def failure(exc: Exception) -> str:
    """The ``process_completed`` error of an event that could not run (nothing of the
    Space's address or of a secret: the messages the JSON API answers with)."""
    if isinstance(exc, (BusyError, FrontBusy)) or refused(exc):
        return f"Queue is full. {exc}"
    if isinstance(exc, (PoolError, FrontUnavailable, AuthError)):
        return str(exc)
    return f"the Space failed ({type(exc).__name__})"
