"""``GET /admin``: the operators' dashboard, one self-contained page.

The page (``app/static/admin.html`` with its script and style sheet, shipped as package
data) carries no pool data and needs no build step, CDN or network beyond this
service. It asks for the admin token once, keeps it in ``sessionStorage`` — in the page's
memory only, asked at each visit, while the service serves Spaces' own pages
(``POOL_GRADIO_PAGES``: their script runs on this origin; the page is then marked
``data-token-store="memory"``) — and sends it
as ``Authorization: Bearer`` to ``/api/admin/pool-stats`` every 2 s; the token never
goes into a URL (the form cannot be submitted anywhere: the policy below forbids it),
and the page is served without auth because it shows nothing until the API accepts
the token.

The response headers lock the page down: a Content-Security-Policy that allows only
this origin's own script, style and fetches, no framing, no referrer, no caching.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response

from ..core import settings_of

_ASSETS = {
    "admin.js": "text/javascript; charset=utf-8",
    "admin.css": "text/css; charset=utf-8",
}
_CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self' data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
_HEADERS = {
    "Content-Security-Policy": _CSP,
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

router = APIRouter(include_in_schema=False)


@cache
def _read(name: str) -> bytes:
    return resources.files("app").joinpath("static", name).read_bytes()


_BODY = b'<body data-renders="0">'


@router.get("/admin")
async def dashboard(request: Request) -> Response:
    """The dashboard page (static; it fetches the stats itself with the token)."""
    page = _read("admin.html")
    if settings_of(request).pages_on:  # the token in the page's memory only
        page = page.replace(_BODY, b'<body data-renders="0" data-token-store="memory">', 1)
    return Response(page, media_type="text/html; charset=utf-8", headers=_HEADERS)


@router.get("/admin/assets/{name}")
async def asset(name: str) -> Response:
    """The page's script and style sheet (a fixed list; nothing else is served)."""
    media_type = _ASSETS.get(name)
    if media_type is None:
        raise HTTPException(404, "no such asset")
    return Response(_read(name), media_type=media_type, headers=_HEADERS)
