"""spacepool: warm connections to Gradio Spaces, behind one admission.

    from pool import get_client, get_pool

    async with get_client("alice@example.com") as client:
        text = await client.predict("hello", 0, api_name="/predict")
        client.space                      # the Space that served it

    done = await get_pool().predict("/predict", "hello", 0, email="alice@example.com")
    done.space, done.result           # with retries, failover, breakers, one deadline

    done = await get_pool().predict("/flip", file_arg("cat.png"), download_to="out/")
    done.result.path, done.result.name    # a file output, fetched while the slot was held

    async with get_client() as client:    # a generator endpoint's partial outputs
        job = await client.submit("hi", api_name="/chat")
        async for text in job.stream():   # each as it arrives; the last is the result
            print(text)
    await get_pool().predict("/chat", "hi", on_partial=show)   # managed: show(Partial)

    async with get_client() as client:    # every protocol message, typed
        job = await client.submit("hi", 2, api_name="/echo", headers={"x-ip-token": t})
        async for event in job.events():  # UpstreamQueued(rank, queue_size, eta_s), ...
            print(event)
    await get_pool().predict("/echo", "hi", 0, on_event=show_event, headers={...})

    async for attempt in get_pool().call("/echo", email=e):   # your own work, the
        with attempt:                                          # pool's queue, refusals,
            async with attempt.lease() as client: ...          # retries and deadline
            break
    app = await get_pool().space_app("alpha")   # what a Space serves without admission:
                                                # space_info, space_file, space_login, ...

    stats = await get_pool().stats()      # the pool-stats dict
    await get_pool().aclose()             # close every connection

``get_pool()`` is the process-wide pool built lazily from ``POOL_*`` settings; nothing
connects at import or construction time. Resilience (adaptive window, breakers,
sleeping Spaces, ``SpaceControl``) lives in :mod:`pool.resilience`; the Gradio wire
protocol in :mod:`pool.transport` (``POOL_TRANSPORT=gradio_client`` falls back to a
``gradio_client.Client`` per connection).

``Holdings``, ``with_logins``, ``cancel_and_wait``, ``cancelling`` and ``tracer`` are here
for the HTTP service (app/), which reaches the pool through its faces only — this module and each
layer's package (docs/architecture.md, Faces) — and are not the library's API
(``__all__``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator

from ._clock import Clock
from ._events import Hook, PoolEvent
from ._exceptions import (
    AmbiguousEndpoint,
    BusyError,
    DeadlineExceeded,
    InvalidRequest,
    LeaseLost,
    MisuseError,
    NoHealthySpaceError,
    PoolClosedError,
    PoolError,
    QuotaExceeded,
    RefusedByPolicy,
    SessionLost,
    SessionNotFound,
    UnknownEndpoint,
    UnknownSpace,
    UpstreamAppError,
    UpstreamError,
    UpstreamFileError,
    UpstreamTransportError,
    UserLimitReached,
)
from ._holdings import Holdings as Holdings  # the service's (see the docstring's end)
from ._pool import Pool
from ._request import CallAttempt, Prediction, PredictOptions
from ._retry import NO_ROOM
from ._sessions import PoolSession
from ._settings import PoolSettings
from ._spaces import Login, SpaceSpec, parse_space, parse_spaces
from ._spaces import with_logins as with_logins
from ._tasks import cancel_and_wait as cancel_and_wait
from ._tasks import cancelling as cancelling
from ._trace import tracer as tracer
from .admission import WaitTicket
from .connections import LocalFile, Partial, PooledClient, PooledJob, check_outbound, is_file_data
from .transport import (
    ProgressUnit,
    UpstreamDone,
    UpstreamEvent,
    UpstreamLog,
    UpstreamPartial,
    UpstreamProgress,
    UpstreamQueued,
    UpstreamStarted,
    file_arg,
)

_pool: Pool | None = None
_pool_lock = threading.Lock()


def get_pool() -> Pool:
    """The process-wide pool, built on first use from ``POOL_*`` settings."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool._closed:
            _pool = Pool()
        return _pool


def set_pool(pool: Pool | None) -> None:
    """Install ``pool`` as the process-wide pool (tests, embedding apps)."""
    global _pool
    with _pool_lock:
        _pool = pool


@contextlib.asynccontextmanager
async def get_client(
    email: str | None = None,
    *,
    space: str | None = None,
    queue_timeout_s: float | None = None,
    ticket: WaitTicket | None = None,
    priority: str | None = None,
) -> AsyncIterator[PooledClient]:
    """Lease a connection for ``email`` (None: anonymous), optionally on ``space``;
    ``priority``: ``"interactive"`` (default) or ``"batch"`` (docs/scheduling.md)."""
    if priority is not None:
        ticket = ticket or WaitTicket()
        ticket.priority = priority
    async with get_pool().client(
        email, space=space, queue_timeout_s=queue_timeout_s, ticket=ticket
    ) as client:
        yield client


__all__ = [
    "NO_ROOM",
    "AmbiguousEndpoint",
    "BusyError",
    "CallAttempt",
    "Clock",
    "DeadlineExceeded",
    "Hook",
    "InvalidRequest",
    "LeaseLost",
    "LocalFile",
    "Login",
    "MisuseError",
    "NoHealthySpaceError",
    "Partial",
    "Pool",
    "PoolClosedError",
    "PoolError",
    "PoolEvent",
    "PoolSession",
    "PoolSettings",
    "PooledClient",
    "PooledJob",
    "PredictOptions",
    "Prediction",
    "ProgressUnit",
    "QuotaExceeded",
    "RefusedByPolicy",
    "SessionLost",
    "SessionNotFound",
    "SpaceSpec",
    "UnknownEndpoint",
    "UnknownSpace",
    "UpstreamAppError",
    "UpstreamDone",
    "UpstreamError",
    "UpstreamEvent",
    "UpstreamFileError",
    "UpstreamLog",
    "UpstreamPartial",
    "UpstreamProgress",
    "UpstreamQueued",
    "UpstreamStarted",
    "UpstreamTransportError",
    "UserLimitReached",
    "WaitTicket",
    "check_outbound",
    "file_arg",
    "get_client",
    "get_pool",
    "is_file_data",
    "parse_space",
    "parse_spaces",
    "set_pool",
]
