"""The one place where errors become HTTP answers (STYLE rule 7).

:func:`describe` maps every exception the service knows — the pool's tree, the
service's own (auth, unknown Space, unknown job), request validation and HTTP
errors — to a :class:`Problem`: status, JSON body, headers and the outcome class the
access log and metrics record. The exception handlers and the job runner (a job's
``error``) both use it, so a failure reads the same whether it came back from
``/api/predict`` or from a job.

Bodies never carry a stack trace, a request payload or a secret: validation errors
drop pydantic's ``input``, policy refusals give only their reason code.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from pool import (
    AmbiguousEndpoint,
    BusyError,
    DeadlineExceeded,
    InvalidRequest,
    LeaseLost,
    NoHealthySpaceError,
    PoolClosedError,
    PoolError,
    QuotaExceeded,
    RefusedByPolicy,
    SessionLost,
    SessionNotFound,
    UnknownEndpoint,
    UnknownSpace,
    UpstreamError,
    UserLimitReached,
)

from ._logging import context_of

_log = logging.getLogger("spacepool.app")

_HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
    416: "range_not_satisfiable",
}


class ServiceError(Exception):
    """Base of the errors the HTTP layer raises itself."""


class AuthError(ServiceError):
    """Missing or wrong bearer token (401), or an endpoint switched off (403)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class InvalidFileReference(InvalidRequest):
    """A file input from an HTTP caller that is not an upload of this service, an
    allowed URL, or a Space's file (docs/security.md): 422 on both faces."""

    kind = "invalid_file_reference"


class JobNotFound(ServiceError):
    """No such job here (never created, expired, or created by another worker)."""


class KeyNotFound(ServiceError):
    """No such API key (never created, or revoked)."""


class KeyNameTaken(ServiceError):
    """Another live API key has this name (names are what usage and metrics show)."""


class FileNotFound(ServiceError):
    """No such file URL here (never issued, expired, evicted, or not a token at all)."""


class UploadTooLarge(ServiceError):
    """The files of one request are larger than ``POOL_MAX_UPLOAD_BYTES``."""


class IdempotencyKeyReused(ServiceError):
    """The ``Idempotency-Key`` was first sent with another request (another body) (422)."""


class IdempotencyKeyInUse(ServiceError):
    """The request that first sent this ``Idempotency-Key`` is still creating its job (409)."""


class JobsFull(ServiceError):
    """The job store holds ``POOL_JOB_MAX`` jobs that are all still running."""

    def __init__(self, limit: int, retry_after_s: float) -> None:
        super().__init__(f"{limit} jobs are in progress; try again later")
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Problem:
    """How one error is answered."""

    status: int
    body: dict[str, Any]
    outcome: str
    headers: dict[str, str] = field(default_factory=dict)


def _retry_after(seconds: float) -> int:
    """Integer seconds, at least 1 (the ``Retry-After`` header's form)."""
    if not math.isfinite(seconds):
        return 1
    return max(1, math.ceil(seconds))


def _quota(exc: QuotaExceeded) -> Problem:  # the caller's own GPU quota (a ZeroGPU Space)
    retry = _retry_after(exc.retry_after_s)
    body = {"error": "quota_exceeded", "reason": exc.reason, "retry_after_s": retry,
            "message": str(exc)}  # fmt: skip
    return Problem(429, body, "quota_exceeded", {"Retry-After": str(retry)})


def _user_limit(exc: UserLimitReached) -> Problem:  # one user's bound: too_many_sessions / _jobs
    retry = _retry_after(exc.retry_after_s)
    body = {"error": exc.reason, "limit": exc.limit, "retry_after_s": retry, "message": str(exc)}
    return Problem(429, body, exc.reason, {"Retry-After": str(retry)})


def _busy(exc: BusyError, message: str = "no capacity within the queue deadline; retry later",
          **extra: Any) -> Problem:  # fmt: skip
    retry = _retry_after(exc.retry_after_s)
    body = {"error": "busy", "reason": exc.reason, "queue_position": exc.queue_position,
            "retry_after_s": retry, "message": message, **extra}  # fmt: skip
    return Problem(503, body, "busy", {"Retry-After": str(retry)})


def _busy_or_unreachable(exc: BusyError) -> Problem:
    if exc.reason == "coordinator_unavailable":
        return _busy(exc, "the admission store is unreachable; nothing is admitted")
    return _busy(exc)


def _lease_lost(exc: LeaseLost) -> Problem:  # a busy answer too: the fleet's slot is gone
    return _busy(exc, "the admission lease ended while the request ran; retry later", lease=exc.why)


def _no_healthy_space(exc: NoHealthySpaceError) -> Problem:
    retry = _retry_after(exc.retry_after_s)
    body = {"error": "no_healthy_space", "message": str(exc), "retry_after_s": retry}
    return Problem(503, body, "no_healthy_space", {"Retry-After": str(retry)})


def _shutting_down(exc: PoolClosedError) -> Problem:
    body = {"error": "shutting_down", "message": "the service is shutting down"}
    return Problem(503, body, "shutting_down", {"Retry-After": "1"})


def _refused(exc: RefusedByPolicy) -> Problem:
    # The message could quote what was refused: give the reason code only.
    body = {"error": "refused", "reason": exc.reason,
            "message": f"refused before sending ({exc.reason})"}  # fmt: skip
    return Problem(422, body, "refused")


def _unknown_endpoint(exc: UnknownEndpoint) -> Problem:
    body = {"error": "unknown_api_name", "message": str(exc), "api_name": exc.api_name,
            "available": exc.available}  # fmt: skip
    return Problem(422, body, "unknown_api_name")


def _ambiguous_endpoint(exc: AmbiguousEndpoint) -> Problem:
    apps = [{"app": app, "spaces": spaces} for app, spaces in exc.apps.items()]
    body = {"error": "ambiguous_endpoint", "message": str(exc), "api_name": exc.api_name,
            "apps": apps}  # fmt: skip
    return Problem(422, body, "ambiguous_endpoint")


def _unknown_space(exc: UnknownSpace) -> Problem:
    body = {"error": "unknown_space", "message": str(exc), "available": exc.available}
    return Problem(422, body, "unknown_space")


def _invalid_file(exc: InvalidFileReference) -> Problem:
    return Problem(422, {"error": exc.kind, "message": str(exc)}, exc.kind)


def _upstream(exc: UpstreamError) -> Problem:
    body = {"error": "upstream", "kind": exc.kind, "message": str(exc)}
    wait = getattr(exc, "retry_after_s", None)  # a 429's Retry-After, passed on
    headers = {"Retry-After": str(_retry_after(wait))} if wait else {}
    return Problem(502, body, f"upstream_{exc.kind}", headers)


def _auth(exc: AuthError) -> Problem:
    body = {"error": exc.code, "message": str(exc)}
    return Problem(exc.status, body, exc.code, {"WWW-Authenticate": "Bearer"})


def _key_in_use(exc: IdempotencyKeyInUse) -> Problem:
    body = {"error": "idempotency_key_in_use", "message": str(exc), "retry_after_s": 1}
    return Problem(409, body, "idempotency_key_in_use", {"Retry-After": "1"})


def _jobs_full(exc: JobsFull) -> Problem:
    retry = _retry_after(exc.retry_after_s)
    body = {"error": "busy", "reason": "jobs_full", "queue_position": 0, "retry_after_s": retry,
            "message": str(exc)}  # fmt: skip
    return Problem(503, body, "busy", {"Retry-After": str(retry)})


def _invalid_body(exc: RequestValidationError) -> Problem:
    detail = [
        {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type")}
        for err in exc.errors()
    ]
    body = {"error": "invalid_body", "message": "the request is invalid", "detail": detail}
    return Problem(422, body, "invalid_body")


def _http(exc: StarletteHTTPException) -> Problem:
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    body = {"error": code, "message": str(exc.detail)}
    return Problem(exc.status_code, body, code, dict(exc.headers or {}))


def _plain(status: int, error: str) -> Callable[[BaseException], Problem]:
    """The answer ``{"error": error, "message": str(exc)}`` with ``status``."""
    return lambda exc: Problem(status, {"error": error, "message": str(exc)}, error)


_ANSWERS: dict[type[BaseException], Callable[[Any], Problem]] = {
    QuotaExceeded: _quota,
    UserLimitReached: _user_limit,
    LeaseLost: _lease_lost,
    BusyError: _busy_or_unreachable,
    NoHealthySpaceError: _no_healthy_space,
    PoolClosedError: _shutting_down,
    DeadlineExceeded: _plain(504, "deadline"),
    RefusedByPolicy: _refused,
    UnknownEndpoint: _unknown_endpoint,
    AmbiguousEndpoint: _ambiguous_endpoint,
    SessionNotFound: _plain(404, "session_not_found"),
    SessionLost: _plain(410, "session_lost"),
    UnknownSpace: _unknown_space,
    InvalidFileReference: _invalid_file,
    InvalidRequest: _plain(422, "invalid_request"),
    UpstreamError: _upstream,
    AuthError: _auth,
    JobNotFound: _plain(404, "job_not_found"),
    KeyNameTaken: _plain(409, "key_name_taken"),
    KeyNotFound: _plain(404, "key_not_found"),
    FileNotFound: _plain(404, "file_not_found"),
    UploadTooLarge: _plain(413, "too_large"),
    IdempotencyKeyReused: _plain(422, "idempotency_key_reused"),
    IdempotencyKeyInUse: _key_in_use,
    JobsFull: _jobs_full,
    RequestValidationError: _invalid_body,
    StarletteHTTPException: _http,
}
"""How each exception class is answered. An exception takes the answer of the first class
of its MRO found here (its own, else its nearest registered base): ``LeaseLost`` is
answered as itself, a ``BusyError`` of another kind as busy."""


def describe(exc: BaseException) -> Problem:
    """The answer for ``exc``; anything unknown is a bare 500 ``internal``."""
    for cls in type(exc).__mro__:
        answer = _ANSWERS.get(cls)
        if answer is not None:
            return answer(exc)
    kind = exc.kind if isinstance(exc, PoolError) else type(exc).__name__
    return Problem(500, {"error": "internal", "message": "internal error"}, f"internal_{kind}")


def internal_error(request_id: str) -> tuple[int, bytes]:
    """The 500 answer of last resort (used by the access log middleware)."""
    body = {"error": "internal", "message": "internal error", "request_id": request_id}
    return 500, json.dumps(body).encode()


def _allowed(request: Request) -> str:
    """The methods the OpenAPI document gives this path (Starlette's 405 names only the
    first route's: ``GET`` for ``/api/jobs/{id}``, which ``DELETE`` answers too)."""
    methods: set[str] = set()
    for template, operations in request.app.openapi().get("paths", {}).items():
        pattern = re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, request.url.path):
            methods |= {method.upper() for method in operations}
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods))


def _front(path: str) -> bool:
    """A request to the Gradio front (``/gradio/...``), refused before its route ran
    (its bearer token or API key, a key's quota, a body too large)."""
    return path == "/gradio" or path.startswith("/gradio/")


CLIENT_CLOSED = 499
"""The status logged for a request its client left before the answer (nginx's 499)."""


def install(app: FastAPI) -> None:
    """Register the handlers: one function for every exception class we answer."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        problem = describe(exc)
        ctx = context_of(request)
        ctx.outcome = problem.outcome
        if problem.status >= 500 and problem.body.get("error") == "internal":
            _log.error(
                "unexpected %s", type(exc).__name__, exc_info=exc,
                extra={"request_id": ctx.request_id},
            )  # fmt: skip
        body = {**problem.body, "request_id": ctx.request_id}
        if _front(request.url.path):
            # The Gradio front's form (app/gradio/_routes.py ``_error``): ``detail`` is
            # what @gradio/client shows of a refused request (a quota, a key, busy).
            message = str(problem.body.get("message") or problem.body.get("error") or "error")
            detail: str | list[dict[str, Any]] = message
            if problem.status == 503:
                detail = f"Queue is full. {message}"
            elif problem.status == 422:  # Gradio's validator list: gradio_client reads it
                detail = [{"__type__": "validate", "is_valid": False,
                           "parameter_name": "data", "message": message}]  # fmt: skip
            body = {"detail": detail, **body}
        headers = problem.headers
        if problem.status == 405:
            headers = {**headers, "Allow": _allowed(request)}
        return JSONResponse(body, status_code=problem.status, headers=headers)

    async def gone(request: Request, exc: Exception) -> Response:
        """The client went away mid-request (mid-body): the client's doing, not ours —
        no 500, no traceback; 499 in the access log, its quota call given back."""
        context_of(request).outcome = "client_disconnected"
        return Response(status_code=CLIENT_CLOSED)  # never read: nobody is there

    for exc_class in (
        PoolError,
        ServiceError,
        RequestValidationError,
        StarletteHTTPException,
    ):
        app.add_exception_handler(exc_class, handle)
    app.add_exception_handler(ClientDisconnect, gone)
