"""Cap request bodies in bytes before anything parses them.

A pure ASGI wrapper around ``receive`` (no buffering, no ``BaseHTTPMiddleware``):
a body announced or streamed past the cap raises :class:`PayloadTooLarge` from the
``receive`` call inside the handler's body parsing, so the one error mapping in
:mod:`app.core._errors` answers it (413) like any other error. A multipart body (files)
has its own cap: ``POOL_MAX_BODY_BYTES`` plus ``POOL_MAX_UPLOAD_BYTES``.
"""

from __future__ import annotations

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class PayloadTooLarge(HTTPException):
    """The request body is larger than ``POOL_MAX_BODY_BYTES``."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes")
        self.limit = limit


class BodySizeLimit:
    """Refuse (413) bodies above ``max_bytes``, whether announced or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int, multipart_max_bytes: int = 0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.multipart_max_bytes = max(max_bytes, multipart_max_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        limit = self.multipart_max_bytes if _is_multipart(scope) else self.max_bytes
        announced = _content_length(scope)
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            if announced is not None and announced > limit:
                raise PayloadTooLarge(limit)
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise PayloadTooLarge(limit)
            return message

        await self.app(scope, limited_receive, send)


def _is_multipart(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return bool(value.lower().lstrip().startswith(b"multipart/"))
    return False


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
