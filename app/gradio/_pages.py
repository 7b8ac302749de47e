"""The Spaces' own web pages, served by the front to browsers (issue 42).

``GET /gradio/{alias}/`` (and ``/gradio/`` over replicas of one app) answers the
Space's own Gradio page, and everything it loads (gradio/routes.py ``main``,
``build_resource`` ``/assets``, ``static_resource`` ``/static``, ``/svelte``,
``/theme.css``, ``/favicon.ico``, ``/manifest.json``, ``/pwa_icon``, ``/robots.txt``,
``custom_component_path``), fetched from the Space. The page's events then reach the
front's routes (:mod:`._routes`): each one a pool call.

* **The page** is the Space's HTML with its embedded ``window.gradio_config`` and
  ``window.gradio_api_info`` rewritten: ``root`` is the front's scope and no Space
  address is left anywhere in it (the Space's root and address replaced, then checked).
  Its ``<link rel="manifest" href="/manifest.json">`` (an absolute path in Gradio's
  template) points to the scope's. The Space's HTML is kept :data:`PAGE_TTL_S` per
  Space and ``app_id`` (a restart brings a new one).
* **A Space behind Gradio's login**: without the front's login cookie for the scope
  (:mod:`._login`), the page carries the config a Space sends before its login (routes.py
  ``main``: ``auth_required``, nothing of the app), so the browser shows Gradio's login
  form, which posts to the front's ``login``.
* **Static files** are kept by the service (:class:`StaticCache`: per Space, ``app_id``
  and path, at most :data:`CACHE_ENTRY_MAX_BYTES` a file and :data:`CACHE_MAX_BYTES` in
  all, least recently used dropped first), so a crowd opening a page does not reach the
  Space for each file. Bigger files are streamed through.
* **Off by default**: ``POOL_GRADIO_PAGES`` (``true`` or a list of aliases) turns them
  on (docs/security.md: a page runs the Space's script on the service's origin). Off, a
  browser at the page gets a short HTML page saying how to turn them on; the page's
  files are 404. With ``POOL_API_TOKEN`` set, a page and its files need the token like
  every route (401 otherwise, saying that pages need an open front or a proxy adding it).
* **The visitor**: a page's first load sets the visitor cookie (:mod:`._visitors`).
"""

from __future__ import annotations

import collections
import contextlib
import html
import json
import re
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)

from pool import Pool, get_pool
from pool.transport import AppInfo

from ..core import AuthError, services_of, settings_of
from ..edge import require_api_token
from . import _login
from ._rewrite import rewriter
from ._routes import _TOKEN, _answering, _front_root, _scope
from ._run import run
from ._space_view import served
from ._visitors import front_path, welcome

PAGE_TTL_S = 10.0  # the Space's page HTML kept this long (per Space and app_id)
CACHE_MAX_BYTES = 64 * 1024 * 1024  # static files kept, in all …
CACHE_ENTRY_MAX_BYTES = 4 * 1024 * 1024  # … each at most (bigger: streamed through)
CACHE_MAX_ENTRIES = 4096
_PASSED = ("content-type", "cache-control", "etag", "last-modified")
_NOT_FOUND = {"detail": "Not Found"}
_CONFIG = re.compile(r"(<script>window\.gradio_config = )(.*?)(;</script>)", re.S)
_API_INFO = re.compile(r"(<script>window\.gradio_api_info = )(.*?)(;</script>)", re.S)
_MANIFEST = 'href="/manifest.json"'

router = APIRouter(include_in_schema=False)


# -- the cache of static files -------------------------------------------------------------
@dataclass(frozen=True)
class Cached:
    status: int
    headers: dict[str, str]
    body: bytes


class StaticCache:
    """Static files of the Spaces, bounded (bytes, entries), least recently used first out."""

    def __init__(self, max_bytes: int = CACHE_MAX_BYTES, max_entries: int = CACHE_MAX_ENTRIES):
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.bytes = 0
        self.hits = self.misses = 0
        self._entries: collections.OrderedDict[tuple[str, ...], Cached] = collections.OrderedDict()

    def get(self, key: tuple[str, ...]) -> Cached | None:
        cached = self._entries.get(key)
        if cached is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return cached

    def put(self, key: tuple[str, ...], cached: Cached) -> None:
        if len(cached.body) > min(CACHE_ENTRY_MAX_BYTES, self.max_bytes):
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= len(old.body)
        self._entries[key] = cached
        self.bytes += len(cached.body)
        while self.bytes > self.max_bytes or len(self._entries) > self.max_entries:
            _, dropped = self._entries.popitem(last=False)
            self.bytes -= len(dropped.body)


_PAGES: dict[tuple[str, str], tuple[float, str]] = {}  # (space, app_id) -> (fetched, HTML)


def _cache(request: Request) -> StaticCache:
    """The process's cache (made on first use: it needs nothing of the lifespan)."""
    services = services_of(request)
    return services.find(StaticCache) or services.provide(StaticCache())


# -- who may see a page --------------------------------------------------------------------
def _pages_off(scope: str | None) -> Response:
    """With pages off: a short page saying how to turn them on (not a JSON 404)."""
    where = f"/gradio/{scope}/" if scope is not None else "/gradio/"
    setting = "true" if scope is None else f"true</code> or <code>{html.escape(scope)}"
    body = (
        "<!doctype html><html lang=en><meta charset=utf-8>"
        "<title>Pages are off</title>"
        f"<h1>This service does not serve the page of {html.escape(where)}</h1>"
        "<p>This is spacepool's Gradio front. It answers the Gradio API here (point"
        " <code>gradio_client</code> or <code>@gradio/client</code> at this URL), but the"
        " Spaces' own web pages are off by default.</p>"
        f"<p>The operator turns them on with <code>POOL_GRADIO_PAGES={setting}</code>"
        " (a comma-separated list of aliases, or <code>true</code> for all); read"
        " docs/security.md first: a page runs the Space's script on this service's"
        " origin.</p></html>"
    )
    return HTMLResponse(body, status_code=404, headers={"Cache-Control": "no-store"})


async def _refusal(request: Request) -> Response | None:
    """Pages off for the scope (404), or ``POOL_API_TOKEN`` not presented (401)."""
    scope = _scope(request)
    settings = settings_of(request)
    if not settings.pages_for(scope):
        if request.url.path.rstrip("/").endswith(f"/gradio/{scope}" if scope else "/gradio"):
            return _pages_off(scope)
        return JSONResponse(_NOT_FOUND, status_code=404)
    try:
        await require_api_token(request)
    except AuthError as exc:
        text = (
            f"{exc}. This service's Gradio front is behind POOL_API_TOKEN: a browser"
            " cannot send the token, so pages need an open front (POOL_API_TOKEN unset)"
            " or a proxy in front that adds the token (Authorization: Bearer) to every"
            " request under /gradio/."
        )
        return HTMLResponse(f"<!doctype html><meta charset=utf-8><p>{html.escape(text)}</p>",
                            status_code=exc.status)  # fmt: skip
    return None


# -- the page ------------------------------------------------------------------------------
async def page(request: Request) -> Response:
    """``GET B/``: the Space's page, its config's ``root`` the front's."""
    if (refused := await _refusal(request)) is not None:
        return refused
    scope = _scope(request)
    pool = get_pool()
    name, app = await served(pool, scope)
    source = await _space_page(pool, name, app)
    front_root = _front_root(request)
    logged_out = await _login.refusal(request, scope) is not None
    try:
        body = render(source, app, front_root, logged_out=logged_out)
    except ValueError as exc:  # not a Gradio page: nothing of it is served
        return JSONResponse({"detail": f"the Space's page cannot be served: {exc}"},
                            status_code=502)  # fmt: skip
    response = HTMLResponse(body, headers={"Cache-Control": "no-store",
                                           "X-Content-Type-Options": "nosniff"})  # fmt: skip
    welcome(request, response, front_path(front_root))
    return response


async def _space_page(pool: Pool, name: str, app: AppInfo) -> str:
    """The Space's own page (its root, with the pool's login if it has one), kept
    :data:`PAGE_TTL_S`."""
    key = (name, str(app.app_id))
    kept = _PAGES.get(key)
    if kept is not None and time.monotonic() - kept[0] < PAGE_TTL_S:
        return kept[1]
    async with pool.space_web(name, "") as response:
        await response.aread()
    if response.status_code != 200:
        raise httpx.HTTPStatusError(f"the Space's page answered {response.status_code}",
                                    request=response.request, response=response)  # fmt: skip
    text = response.text
    if len(_PAGES) > 256:
        _PAGES.clear()
    _PAGES[key] = (time.monotonic(), text)
    return text


def _dumps(value: Any) -> str:
    """JSON inside a ``<script>``, escaped as Gradio's template escapes it (routes.py
    ``toorjson``)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):  # fmt: skip
        text = text.replace(char, escaped)
    return text


def _login_config(config: dict[str, Any], root: str) -> dict[str, Any]:
    """What a Space's page carries before its login (gradio/routes.py ``main``)."""
    return {
        "auth_required": True, "auth_message": config.get("auth_message"),
        "space_id": config.get("space_id"), "root": root, "page": {"": {"layout": {}}},
        "pages": [""], "components": [], "dependencies": [], "current_page": "",
    }  # fmt: skip


def render(source: str, app: AppInfo, front_root: str, *, logged_out: bool = False) -> str:
    """The Space's page ``source`` as the front serves it (module docstring)."""
    root = front_root.rstrip("/")
    match = _CONFIG.search(source)
    if match is None:
        raise ValueError("the Space's page has no window.gradio_config")
    config = json.loads(match.group(2))
    space_roots = {app.src.rstrip("/")}
    if isinstance(config.get("root"), str) and config["root"].startswith(("http://", "https://")):
        space_roots.add(config["root"].rstrip("/"))
    rewrites = [rewriter(src, root) for src in sorted(space_roots, key=len, reverse=True)]

    def rewrite(value: Any) -> Any:
        for each in rewrites:
            value = each(value)
        return value

    config = rewrite(config)
    config["root"] = root
    config["username"] = None  # the page was fetched with the pool's own login, if any
    if logged_out:
        config = _login_config(config, root)
    info_match = _API_INFO.search(source)
    info: Any = rewrite(json.loads(info_match.group(2))) if info_match else None
    if logged_out:
        info = {"named_endpoints": {}, "unnamed_endpoints": {}}
    out = _CONFIG.sub(lambda m: m.group(1) + _dumps(config) + m.group(3), source, count=1)
    if info_match is not None:
        out = _API_INFO.sub(lambda m: m.group(1) + _dumps(info) + m.group(3), out, count=1)
    for src in sorted(space_roots, key=len, reverse=True):  # e.g. the template's `const root`
        out = out.replace(src, root).replace(html.escape(src), html.escape(root))
    host = urllib.parse.urlsplit(app.src).netloc
    if host and host in out:  # the Space's address in another form: never served
        out = out.replace(host, urllib.parse.urlsplit(root).netloc or "")
    return out.replace(_MANIFEST, 'href="./manifest.json"')


# -- the page's files ------------------------------------------------------------------------
def _safe(path: str) -> str | None:
    """``path`` when it cannot leave the route it names (no ``.``/``..`` segment, no
    backslash, control character, ``?`` or ``#``), else None."""
    if any(ch in path for ch in "\\\x00?#") or not path.isprintable():
        return None
    if any(part in ("..", ".") for part in path.split("/")):
        return None
    return path


def _static(upstream: Callable[[AppInfo, str], str]) -> Callable[[Request], Any]:
    """A route relaying a static file of the served Space (kept by :class:`StaticCache`);
    ``upstream`` names its path on the Space from the app and the route's ``path``."""

    async def relay(request: Request) -> Response:
        if (refused := await _refusal(request)) is not None:
            return refused
        path = _safe(str(request.path_params.get("path", "")))
        if path is None:
            return JSONResponse(_NOT_FOUND, status_code=404)
        pool = get_pool()
        name, app = await served(pool, _scope(request))
        web = upstream(app, path)
        if request.url.query:
            web += "?" + request.url.query
        key = (name, str(app.app_id), web)
        cache = _cache(request)
        cached = cache.get(key)
        if cached is not None:
            return Response(cached.body, status_code=cached.status, headers=cached.headers)
        return await _fetch(cache, key, pool, name, web)

    return relay


async def _fetch(cache: StaticCache, key: tuple[str, ...], pool: Pool, name: str,
                 web: str) -> Response:  # fmt: skip
    """The Space's file ``web``: kept when it is small enough, else streamed through."""
    stack = contextlib.AsyncExitStack()
    try:
        upstream = await stack.enter_async_context(pool.space_web(name, web))
        if upstream.status_code != 200:
            await stack.aclose()
            return JSONResponse(_NOT_FOUND if upstream.status_code == 404 else
                                {"detail": f"the Space answered HTTP {upstream.status_code}"},
                                status_code=upstream.status_code)  # fmt: skip
        headers = {k: v for k in _PASSED if (v := upstream.headers.get(k)) is not None}
        headers["X-Content-Type-Options"] = "nosniff"
        chunks: list[bytes] = []
        size = 0
        body = upstream.aiter_bytes(64 * 1024)  # decoded (the Space may compress)
        async for chunk in body:
            chunks.append(chunk)
            size += len(chunk)
            if size > CACHE_ENTRY_MAX_BYTES:  # too big to keep: the rest streamed through
                return StreamingResponse(_through(chunks, body, stack.pop_all()),
                                         headers=headers)  # fmt: skip
    except BaseException:
        await stack.aclose()
        raise
    await stack.aclose()
    kept = Cached(200, headers, b"".join(chunks))
    cache.put(key, kept)
    return Response(kept.body, headers=headers)


async def _through(
    head: list[bytes], rest: AsyncIterator[bytes], stack: contextlib.AsyncExitStack
) -> AsyncIterator[bytes]:
    async with stack:
        for chunk in head:
            yield chunk
        async for chunk in rest:
            yield chunk


async def upload_progress(request: Request) -> Response:
    """``GET gradio_api/upload_progress``: the front's uploads are whole once the
    upload request is answered, so the progress stream says done at once (gradio/
    routes.py ``get_upload_progress``'s last message)."""
    if (refused := await _refusal(request)) is not None:
        return refused
    return Response('data: {"msg": "done"}\n\n', media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache"})  # fmt: skip


async def to_page(request: Request) -> Response:
    """``GET B`` (no slash): to ``B/``, where the page's relative files resolve."""
    return RedirectResponse(request.url.path + "/", status_code=307)


def _api(app: AppInfo) -> str:
    """The Space's API prefix as a path under its address (``gradio_api/``)."""
    return app.prefixed[len(app.src) :] if app.prefixed.startswith(app.src) else "gradio_api/"


# Each route's name under the scope and its path on the Space (gradio/routes.py).
_FILES: list[tuple[str, Callable[[AppInfo, str], str]]] = [
    ("/assets/{path:path}", lambda app, path: "assets/" + urllib.parse.quote(path)),
    ("/static/{path:path}", lambda app, path: "static/" + urllib.parse.quote(path)),
    ("/svelte/{path:path}", lambda app, path: "svelte/" + urllib.parse.quote(path)),
    ("/theme.css", lambda app, _: "theme.css"),
    ("/gradio_api/theme.css", lambda app, _: _api(app) + "theme.css"),
    ("/favicon.ico", lambda app, _: "favicon.ico"),
    ("/manifest.json", lambda app, _: "manifest.json"),
    ("/robots.txt", lambda app, _: "robots.txt"),
    ("/pwa_icon", lambda app, _: "pwa_icon"),
    ("/pwa_icon/{path}", lambda app, path: "pwa_icon/" + urllib.parse.quote(path)),
    ("/gradio_api/custom_component/{path:path}",
     lambda app, path: _api(app) + "custom_component/" + urllib.parse.quote(path)),
]  # fmt: skip


def _add(base: str) -> None:
    router.add_api_route(base + "/", _answering(page, checked=False), methods=["GET", "HEAD"])
    for path, upstream in _FILES:
        router.add_api_route(base + path, _answering(_static(upstream), checked=False),
                             methods=["GET"])  # fmt: skip
    router.add_api_route(base + "/gradio_api/upload_progress", _answering(upload_progress),
                         methods=["GET"])  # fmt: skip
    # The events a page runs outside its queue: pool calls (:mod:`._run`).
    router.add_api_route(base + "/gradio_api/run/{api_name}", _answering(run), methods=["POST"],
                         dependencies=_TOKEN)  # fmt: skip


_add("/gradio")
_add("/gradio/{alias}")
router.add_api_route("/gradio/{alias}", to_page, methods=["GET"])
router.add_api_route("/gradio", to_page, methods=["GET"])
