"""JSON logs: one line per request, and the pool's own warnings in the same format.

What a line may carry is a fixed list of fields (:data:`FIELDS`, plus time, level,
logger, worker pid and message): request id, method,
path *template*, status, Space, queued and total milliseconds, outcome class and the
keyed hash of the user (``pool.hash_user``). Never bodies, results, emails, tokens or
headers — the formatter drops any other ``extra`` a caller might pass.

:class:`AccessLog` is a pure ASGI middleware (no ``BaseHTTPMiddleware``, which would
buffer the SSE stream). It gives each request a :class:`RequestContext` in its scope,
that handlers and the error mapping fill in, returns the request id in
``X-Request-ID``, counts the request for ``/metrics`` and writes the line when the
response ends. An exception no handler mapped becomes a bare 500 here, logged with its
traceback (the caller gets only the request id).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import _metrics

SCOPE_KEY = "spacepool.request"
FIELDS = (
    "request_id",
    "method",
    "path",
    "status",
    "space",
    "queued_ms",
    "duration_ms",
    "outcome",
    "user",
    "key",
    "job_id",
    "stage",
)
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_HANDLER_MARK = "_spacepool_json"
access_log = logging.getLogger("spacepool.http")


@dataclass
class RequestContext:
    """What one request's log line will say; filled in as the request goes."""

    request_id: str
    space: str | None = None
    queued_ms: float | None = None
    outcome: str | None = None
    user: str | None = None
    key: str | None = None  # the API key's name (app/teams/_keys.py), never its secret
    # A call counted against the key's daily quota as the request entered (app/edge/_auth.py):
    # given back when the request made no call after all — refused (4xx) or answered
    # from an earlier request (an Idempotency-Key replay sets ``made_no_call``).
    unspend: Callable[[], Awaitable[None]] | None = None
    made_no_call: bool = False


def context_of(request: Request) -> RequestContext:
    """The request's context (made on the spot if the middleware is not installed)."""
    ctx = request.scope.get(SCOPE_KEY)
    if not isinstance(ctx, RequestContext):
        ctx = RequestContext(uuid.uuid4().hex)
        request.scope[SCOPE_KEY] = ctx
    return ctx


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and the allowed fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(level: int = logging.INFO) -> None:
    """JSON to stderr for ``spacepool.*`` (ours and the pool's); idempotent.

    uvicorn's access log is switched off: the line :class:`AccessLog` writes replaces
    it, with the route template instead of the raw path.
    """
    logger = logging.getLogger("spacepool")
    if not any(getattr(h, _HANDLER_MARK, False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        setattr(handler, _HANDLER_MARK, True)
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True


class AccessLog:
    """Request id, ``X-Request-ID``, HTTP metrics and the one JSON line per request."""

    def __init__(self, app: ASGIApp, internal_error: Callable[[str], tuple[int, bytes]]) -> None:
        self.app = app
        self.internal_error = internal_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        ctx = RequestContext(_request_id(scope))
        scope[SCOPE_KEY] = ctx
        status = 500
        response_started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                response_started = True
                status = int(message["status"])
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", ctx.request_id.encode()))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            access_log.exception(
                "unhandled error", extra={"request_id": ctx.request_id, "path": _template(scope)}
            )
            ctx.outcome = "internal"
            if response_started:
                raise
            code, body = self.internal_error(ctx.request_id)
            await send_with_id(
                {
                    "type": "http.response.start",
                    "status": code,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
        finally:
            if ctx.unspend is not None and (ctx.made_no_call or 400 <= status < 500):
                with contextlib.suppress(Exception):  # best effort, as the count itself
                    await ctx.unspend()
            elapsed = time.monotonic() - started
            path = _template(scope)
            method = str(scope.get("method", ""))
            _metrics.observe_http(method, path, status, elapsed)
            access_log.info(
                "request",
                extra={
                    "request_id": ctx.request_id,
                    "method": method,
                    "path": path,
                    "status": status,
                    "space": ctx.space,
                    "queued_ms": ctx.queued_ms,
                    "duration_ms": round(elapsed * 1000, 1),
                    "outcome": ctx.outcome or ("ok" if status < 400 else f"http_{status}"),
                    "user": ctx.user,
                    "key": ctx.key,
                },
            )


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            candidate: str = value.decode("latin-1")
            if _REQUEST_ID.match(candidate):
                return candidate
            break
    return uuid.uuid4().hex


def _template(scope: Scope) -> str:
    """The matched route's template (bounded), never the raw path."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "<unmatched>"
