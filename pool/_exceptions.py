"""The one exception tree of spacepool.

Every error the library raises on purpose is a :class:`PoolError`; errors of
gradio_client, httpx and huggingface_hub are mapped to it at the boundary
(``raise X from exc``), so callers never need to import those libraries::

    PoolError
    ├── BusyError                 no admission within the queue deadline (or the
    │   │                         coordinator is unreachable): carries queue_position
    │   │                         and retry_after_s; the caller should come back later
    │   ├── LeaseLost             the admission lease of a running request ended (not
    │   │                         renewed before its local expiry, or gone from the
    │   │                         store): the upstream job was cancelled (self-fencing)
    │   ├── QuotaExceeded         a ZeroGPU Space says the caller's GPU quota is spent
    │   │                         (or no GPU is free for them): the user's, not the
    │   │                         Space's; retry_after_s from the Space's message
    │   └── UserLimitReached      the user already holds as many open sessions (or jobs
    │                             not yet final) as allowed; reason too_many_sessions /
    │                             too_many_jobs, retry_after_s an estimate
    ├── NoHealthySpaceError       every candidate Space failed, is unhealthy, has its
    │                             breaker open, or did not wake up in time
    ├── DeadlineExceeded          the per-request deadline passed; the upstream job
    │                             was cancelled and the slot freed
    ├── RefusedByPolicy           refused before sending (e.g. a secret in the payload);
    │                             carries a reason code; never counts against a Space
    ├── InvalidRequest            the caller's own mistake, detected by the Space or by us:
    │   │                         unknown api_name, inputs the Space's validator refused
    │   ├── UnknownEndpoint       api_name the Space does not have (lists the ones it has)
    │   ├── UnknownSpace          a Space name that is not configured (lists the ones that are)
    │   ├── AmbiguousEndpoint     a call without a Space whose api_name belongs to apps with
    │   │                         different APIs (lists them); nothing was admitted
    │   └── SessionNotFound       a session id that is unknown, expired, deleted or not
    │                             the caller's
    ├── SessionLost               the session's Space restarted or lost the session: its
    │                             gr.State is gone (never replaced by a fresh one silently)
    ├── UpstreamError             the Space failed to serve a valid request
    │   ├── UpstreamAppError      the app itself raised (gr.Error, exception in the fn)
    │   ├── UpstreamTransportError  connection refused/dropped, timeout, 5xx, queue full
    │   │                         (``kind`` tells which; these count as provider failures;
    │   │                         ``before_accept``: the Space never took the request)
    │   └── UpstreamFileError     an output file could not be fetched, or is larger than
    │                             allowed (``kind``: file_fetch, file_too_large)
    └── MisuseError               programming errors: handle used after release, lease
        │                         released twice or by a non-owner, pool closed
        └── PoolClosedError

``kind`` attributes are short, bounded strings suitable for metric labels.
"""

from __future__ import annotations


class PoolError(Exception):
    """Base of every error spacepool raises on purpose."""

    kind: str = "error"


class BusyError(PoolError):
    """No admission within the queue deadline; try again after ``retry_after_s``."""

    kind = "busy"

    def __init__(
        self,
        message: str,
        *,
        queue_position: int,
        retry_after_s: float,
        reason: str = "queue_timeout",
    ) -> None:
        super().__init__(message)
        self.queue_position = queue_position
        self.retry_after_s = retry_after_s
        self.reason = reason


class LeaseLost(BusyError):
    """The request's lease ended while it ran; its upstream job was cancelled.

    ``why`` says how: ``expired`` (not renewed before its local expiry: a stall, a
    partition or an outage of the store), ``missing`` (the store no longer had it) or
    ``not_restored`` (a restarted store had given its slot away). Nothing runs under
    a lost lease any more; retry after ``retry_after_s``.
    """

    kind = "lease_lost"

    def __init__(self, message: str, *, why: str, retry_after_s: float) -> None:
        super().__init__(
            message, queue_position=0, retry_after_s=retry_after_s, reason="lease_lost"
        )
        self.why = why


class QuotaExceeded(BusyError):
    """A ZeroGPU Space refused the call for the caller's identity: its GPU quota is
    spent (``reason`` ``gpu_quota``) or no GPU was free for it (``no_gpu``).

    The quota belongs to the user (``x-ip-token``), not the Space: the call is not
    retried nor sent elsewhere, and the Space's window and breaker do not move.
    ``retry_after_s`` is the wait the Space named (pool/transport/_quota.py).
    """

    kind = "quota_exceeded"

    def __init__(self, message: str, *, retry_after_s: float, reason: str = "gpu_quota") -> None:
        super().__init__(message, queue_position=0, retry_after_s=retry_after_s, reason=reason)


class UserLimitReached(BusyError):
    """The user (an email's keyed hash; every anonymous caller together as one) already
    holds ``limit`` of what they asked for: open sessions (``reason``
    ``too_many_sessions``) or jobs not yet final (``too_many_jobs``). Nothing was
    started; end one, or retry after ``retry_after_s`` (pool/_holdings.py)."""

    kind = "user_limit"

    def __init__(self, message: str, *, reason: str, limit: int, retry_after_s: float) -> None:
        super().__init__(message, queue_position=0, retry_after_s=retry_after_s, reason=reason)
        self.limit = limit


class NoHealthySpaceError(PoolError):
    """Every candidate Space failed or is marked unhealthy; retry after ``retry_after_s``."""

    kind = "no_healthy_space"

    def __init__(self, message: str, *, retry_after_s: float = 30.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(PoolError):
    """The request's deadline passed; the upstream job was cancelled."""

    kind = "deadline"


class RefusedByPolicy(PoolError):
    """Refused before anything was sent; ``reason`` is a short code."""

    kind = "policy"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class InvalidRequest(PoolError):
    """The caller's request cannot be served as sent (not the Space's fault)."""

    kind = "invalid_request"


class UnknownEndpoint(InvalidRequest):
    """The Space has no such ``api_name``."""

    kind = "unknown_endpoint"

    def __init__(self, api_name: str, available: list[str], where: str = "this Space has") -> None:
        super().__init__(
            f"unknown api_name {api_name!r}; {where}: {', '.join(available) or '(none)'}"
        )
        self.api_name = api_name
        self.available = available


class UnknownSpace(InvalidRequest):
    """No Space of that name is configured."""

    kind = "unknown_space"

    def __init__(self, space: str, available: list[str]) -> None:
        super().__init__(f"unknown Space {space!r}; configured: {', '.join(available)}")
        self.space = space
        self.available = available


class AmbiguousEndpoint(InvalidRequest):
    """``api_name`` belongs to several apps with different APIs: name a ``space``."""

    kind = "ambiguous_endpoint"

    def __init__(self, api_name: str, apps: dict[str, list[str]]) -> None:
        listed = "; ".join(f"{app}: {', '.join(spaces)}" for app, spaces in apps.items())
        super().__init__(
            f"api_name {api_name!r} belongs to apps with different APIs ({listed});"
            " name the Space to call"
        )
        self.api_name = api_name
        self.apps = apps


class SessionNotFound(InvalidRequest):
    """No live session of that id for this caller (unknown, expired, deleted, not theirs)."""

    kind = "session_not_found"


class SessionLost(PoolError):
    """The session's Space restarted (a new ``app_id``) or lost the session: the state
    it kept is gone. The session is deleted; open a new one."""

    kind = "session_lost"


class UpstreamError(PoolError):
    """The Space failed to serve a valid request."""

    kind = "upstream"


class UpstreamAppError(UpstreamError):
    """The Gradio app raised while handling the request."""

    kind = "app_error"


class UpstreamTransportError(UpstreamError):
    """Transport-level or provider-pressure failure; ``kind`` says which.

    ``before_accept`` is True when the Space never took the request (queue full, 429,
    connection refused): repeating it cannot run it twice.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str = "transport",
        before_accept: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.before_accept = before_accept
        # The wait the Space (or the Hub, 429 Retry-After) asked for: routed around so long.
        self.retry_after_s = retry_after_s


class UpstreamFileError(UpstreamError):
    """An output file could not be fetched from the Space, or is too large to take."""

    def __init__(self, message: str, *, kind: str = "file_fetch") -> None:
        super().__init__(message)
        self.kind = kind


class MisuseError(PoolError):
    """A programming error: use after release, double release, wrong owner."""

    kind = "misuse"


class PoolClosedError(MisuseError):
    """The pool was closed."""

    kind = "closed"
