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


def describe(exc: BaseException) -> Problem:
    """The answer for ``exc``; anything unknown is a bare 500 ``internal``."""
    if isinstance(exc, QuotaExceeded):  # the caller's own GPU quota (a ZeroGPU Space)
        retry = _retry_after(exc.retry_after_s)
        body = {
            "error": "quota_exceeded",
            "reason": exc.reason,
            "retry_after_s": retry,
            "message": str(exc),
        }
        return Problem(429, body, "quota_exceeded", {"Retry-After": str(retry)})
    if isinstance(exc, UserLimitReached):  # one user's bound: too_many_sessions / _jobs
        retry = _retry_after(exc.retry_after_s)
        body = {
            "error": exc.reason,
            "limit": exc.limit,
            "retry_after_s": retry,
            "message": str(exc),
        }
        return Problem(429, body, exc.reason, {"Retry-After": str(retry)})
    if isinstance(exc, BusyError):
        retry = _retry_after(exc.retry_after_s)
        body = {
            "error": "busy",
            "reason": exc.reason,
            "queue_position": exc.queue_position,
            "retry_after_s": retry,
            "message": "no capacity within the queue deadline; retry later",
        }
        if isinstance(exc, LeaseLost):  # a busy answer too: the fleet's slot is gone
            body["message"] = "the admission lease ended while the request ran; retry later"
            body["lease"] = exc.why
        elif exc.reason == "coordinator_unavailable":
            body["message"] = "the admission store is unreachable; nothing is admitted"
        return Problem(503, body, "busy", {"Retry-After": str(retry)})
    if isinstance(exc, NoHealthySpaceError):
        retry = _retry_after(exc.retry_after_s)
        body = {"error": "no_healthy_space", "message": str(exc), "retry_after_s": retry}
        return Problem(503, body, "no_healthy_space", {"Retry-After": str(retry)})
    if isinstance(exc, PoolClosedError):
        body = {"error": "shutting_down", "message": "the service is shutting down"}
        return Problem(503, body, "shutting_down", {"Retry-After": "1"})
    if isinstance(exc, DeadlineExceeded):
        return Problem(504, {"error": "deadline", "message": str(exc)}, "deadline")
    if isinstance(exc, RefusedByPolicy):
        # The message could quote what was refused: give the reason code only.
        body = {
            "error": "refused",
            "reason": exc.reason,
            "message": f"refused before sending ({exc.reason})",
        }
        return Problem(422, body, "refused")
    if isinstance(exc, UnknownEndpoint):
        body = {
            "error": "unknown_api_name",
            "message": str(exc),
            "api_name": exc.api_name,
            "available": exc.available,
        }
        return Problem(422, body, "unknown_api_name")
    if isinstance(exc, AmbiguousEndpoint):
        apps = [{"app": app, "spaces": spaces} for app, spaces in exc.apps.items()]
        body = {"error": "ambiguous_endpoint", "message": str(exc), "api_name": exc.api_name,
                "apps": apps}  # fmt: skip
        return Problem(422, body, "ambiguous_endpoint")
    if isinstance(exc, SessionNotFound):
        body = {"error": "session_not_found", "message": str(exc)}
        return Problem(404, body, "session_not_found")
    if isinstance(exc, SessionLost):
        return Problem(410, {"error": "session_lost", "message": str(exc)}, "session_lost")
    if isinstance(exc, UnknownSpace):
        body = {"error": "unknown_space", "message": str(exc), "available": exc.available}
        return Problem(422, body, "unknown_space")
    if isinstance(exc, InvalidFileReference):
        body = {"error": exc.kind, "message": str(exc)}
        return Problem(422, body, exc.kind)
    if isinstance(exc, InvalidRequest):
        return Problem(422, {"error": "invalid_request", "message": str(exc)}, "invalid_request")
    if isinstance(exc, UpstreamError):
        body = {"error": "upstream", "kind": exc.kind, "message": str(exc)}
        wait = getattr(exc, "retry_after_s", None)  # a 429's Retry-After, passed on
        headers = {"Retry-After": str(_retry_after(wait))} if wait else {}
        return Problem(502, body, f"upstream_{exc.kind}", headers)
    if isinstance(exc, AuthError):
        body = {"error": exc.code, "message": str(exc)}
        return Problem(exc.status, body, exc.code, {"WWW-Authenticate": "Bearer"})
    if isinstance(exc, JobNotFound):
        return Problem(404, {"error": "job_not_found", "message": str(exc)}, "job_not_found")
    if isinstance(exc, KeyNameTaken):
        return Problem(409, {"error": "key_name_taken", "message": str(exc)}, "key_name_taken")
    if isinstance(exc, KeyNotFound):
        return Problem(404, {"error": "key_not_found", "message": str(exc)}, "key_not_found")
    if isinstance(exc, FileNotFound):
        return Problem(404, {"error": "file_not_found", "message": str(exc)}, "file_not_found")
    if isinstance(exc, UploadTooLarge):
        return Problem(413, {"error": "too_large", "message": str(exc)}, "too_large")
    if isinstance(exc, IdempotencyKeyReused):
        body = {"error": "idempotency_key_reused", "message": str(exc)}
        return Problem(422, body, "idempotency_key_reused")
    if isinstance(exc, IdempotencyKeyInUse):
        body = {"error": "idempotency_key_in_use", "message": str(exc), "retry_after_s": 1}
        return Problem(409, body, "idempotency_key_in_use", {"Retry-After": "1"})
    if isinstance(exc, JobsFull):
        retry = _retry_after(exc.retry_after_s)
        body = {
            "error": "busy",
            "reason": "jobs_full",
            "queue_position": 0,
            "retry_after_s": retry,
            "message": str(exc),
        }
        return Problem(503, body, "busy", {"Retry-After": str(retry)})
    if isinstance(exc, RequestValidationError):
        detail = [
            {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type")}
            for err in exc.errors()
        ]
        body = {"error": "invalid_body", "message": "the request is invalid", "detail": detail}
        return Problem(422, body, "invalid_body")
    if isinstance(exc, StarletteHTTPException):
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        body = {"error": code, "message": str(exc.detail)}
        return Problem(exc.status_code, body, code, dict(exc.headers or {}))
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
