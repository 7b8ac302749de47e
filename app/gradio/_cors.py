"""CORS for the Gradio front (``/gradio/…``): pages on other origins calling it with
``@gradio/client`` (issue 42).

A Gradio server answers any origin when it is not on localhost, reflecting the origin
and allowing credentials (gradio/route_utils.py ``CustomCORSMiddleware``). The front's
rules are narrower, since its origin may hold more (the dashboard, other Spaces' pages,
a visitor's cookies):

* only requests under ``/gradio`` are answered; every other route (``/api/admin/*``
  above all) sends no CORS header and answers no preflight;
* an origin listed in ``POOL_CORS_ORIGINS`` is allowed with credentials
  (``Access-Control-Allow-Credentials: true``: its pages send the browser's cookies for
  this service — the front's login and visitor cookies);
* any other origin is allowed without credentials while the front is open
  (``POOL_API_TOKEN`` unset), and not at all while the token guards it (a bearer token
  must not be shipped to browsers: put a backend of your own in front instead,
  docs/gradio-front.md);
* a preflight (``OPTIONS`` with ``Access-Control-Request-Method``) is answered here:
  200 with the methods the front has and the headers asked for (``content-type``,
  ``x-gradio-user``, ``authorization``, ``x-spacepool-user``, …: names only), or 403
  for an origin not allowed. Responses to allowed origins carry the origin and
  ``Vary: Origin``; ``Retry-After`` is exposed to the page's script.
"""

from __future__ import annotations

import re

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core import ServiceSettings

_METHODS = "GET, POST, HEAD, OPTIONS"
_MAX_AGE = "600"
_HEADER_NAMES = re.compile(r"^[A-Za-z0-9-]+(\s*,\s*[A-Za-z0-9-]+)*$")
_MAX_REQUESTED = 1024  # characters of Access-Control-Request-Headers answered


def _front(path: str) -> bool:
    return path == "/gradio" or path.startswith("/gradio/")


class FrontCors:
    """The middleware (module docstring); ``settings`` the service's."""

    def __init__(self, app: ASGIApp, settings: ServiceSettings) -> None:
        self.app = app
        self.listed = settings.cors_listed()
        self.open = settings.api_token is None

    def allowed(self, origin: str) -> tuple[bool, bool]:
        """(whether ``origin`` may read the front's answers, with credentials)."""
        if origin.rstrip("/").lower() in self.listed:
            return True, True
        return self.open, False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None or not _front(path):
            await self.app(scope, receive, send)
            return
        allowed, credentials = self.allowed(origin)
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await self._preflight(send, headers, origin, allowed, credentials)
            return
        if not allowed:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                out["Access-Control-Allow-Origin"] = origin
                if credentials:
                    out["Access-Control-Allow-Credentials"] = "true"
                out["Access-Control-Expose-Headers"] = "Retry-After"
                out.add_vary_header("Origin")
            await send(message)

        await self.app(scope, receive, send_with_cors)

    async def _preflight(
        self, send: Send, headers: Headers, origin: str, allowed: bool, credentials: bool
    ) -> None:
        out: list[tuple[bytes, bytes]] = [(b"vary", b"Origin"), (b"content-length", b"0")]
        status = 200 if allowed else 403
        if allowed:
            out += [
                (b"access-control-allow-origin", origin.encode("latin-1")),
                (b"access-control-allow-methods", _METHODS.encode()),
                (b"access-control-max-age", _MAX_AGE.encode()),
            ]
            if credentials:
                out.append((b"access-control-allow-credentials", b"true"))
            requested = headers.get("access-control-request-headers", "").strip()
            if requested and len(requested) <= _MAX_REQUESTED and _HEADER_NAMES.match(requested):
                out.append((b"access-control-allow-headers", requested.encode()))
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": b""})
