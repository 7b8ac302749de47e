"""The front's pages and CORS without a browser or a Space (issue 42): the page's
rewrite (:func:`app.gradio._pages.render`), the static cache's bounds, and the CORS
rules (:class:`app.gradio._cors.FrontCors`) around a plain ASGI app. The pages in a
real browser: tests/browser/test_pages.py."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from app.core import Services, ServiceSettings
from app.gradio._cors import FrontCors
from app.gradio._pages import Cached, StaticCache, render
from pool.transport import AppInfo

SPACE = "http://10.1.2.3:7861"
FRONT = "https://pool.example/gradio/alpha"


def _source(root: str = SPACE) -> str:
    image = {"url": f"{root}/gradio_api/file=/x.png"}
    config = {"root": root, "protocol": "sse_v3", "app_id": 7, "title": "t",
              "components": [{"id": 1, "props": {"value": image}}],
              "dependencies": [], "username": "pool-login"}  # fmt: skip
    info = {"named_endpoints": {"/echo": {"code": f"Client('{root}/')"}}, "unnamed_endpoints": {}}
    return (
        '<html><head><base href="./" /><script>window.gradio_config = '
        + json.dumps(config).replace("<", "\\u003c")
        + ";</script><script>window.gradio_api_info = "
        + json.dumps(info)
        + f';</script><script>const root = "{root}";</script>'
        + '<link rel="manifest" href="/manifest.json" />'
        + '<script type="module" crossorigin src="./assets/index-x.js"></script></head></html>'
    )


def _app(root: str = SPACE) -> AppInfo:
    return AppInfo(root, {"root": root, "protocol": "sse_v3", "app_id": 7}, {})


def _config(page: str) -> dict[str, Any]:
    match = re.search(r"window\.gradio_config = (.*?);</script>", page, re.S)
    assert match is not None
    parsed: dict[str, Any] = json.loads(match.group(1))
    return parsed


def test_the_page_names_the_front_only() -> None:
    page = render(_source(), _app(), FRONT)
    assert "10.1.2.3" not in page
    config = _config(page)
    assert config["root"] == FRONT
    assert config["components"][0]["props"]["value"]["url"] == f"{FRONT}/gradio_api/file=/x.png"
    assert f'const root = "{FRONT}"' in page
    assert 'href="./manifest.json"' in page and 'href="/manifest.json"' not in page
    assert "./assets/index-x.js" in page  # the page's files: relative, under the scope
    assert config["username"] is None and "pool-login" not in page  # the pool's login


def test_a_space_root_other_than_its_address_is_replaced_too() -> None:
    """The Space computed its root from a forwarded host: that one goes too."""
    page = render(_source("https://space.hf.example"), _app(), FRONT)
    assert "space.hf.example" not in page and "10.1.2.3" not in page
    assert _config(page)["root"] == FRONT


def test_logged_out_page_carries_nothing_of_the_app() -> None:
    page = render(_source(), _app(), FRONT, logged_out=True)
    config = _config(page)
    assert config["auth_required"] is True and config["components"] == []
    assert config["dependencies"] == [] and config["root"] == FRONT
    assert "/echo" not in page and "10.1.2.3" not in page


def test_a_page_without_a_config_is_refused() -> None:
    with pytest.raises(ValueError, match="gradio_config"):
        render("<html></html>", _app(), FRONT)


def test_static_cache_is_bounded() -> None:
    cache = StaticCache(max_bytes=100, max_entries=3)
    for i in range(5):
        cache.put(("s", "1", str(i)), Cached(200, {}, b"x" * 30))
    assert cache.bytes <= 100 and len(cache._entries) == 3
    assert cache.get(("s", "1", "0")) is None and cache.get(("s", "1", "4")) is not None
    cache.put(("s", "1", "big"), Cached(200, {}, b"x" * 101))  # bigger than all: not kept
    assert cache.get(("s", "1", "big")) is None


# -- CORS ------------------------------------------------------------------------------------
LISTED = "https://app.example"
ASK = {"Access-Control-Request-Method": "POST",
       "Access-Control-Request-Headers": "content-type, x-gradio-user"}  # fmt: skip


def _client(**settings: Any) -> httpx.AsyncClient:
    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    inner = Starlette(routes=[Route("/{path:path}", ok, methods=["GET", "POST"])])
    app = FrontCors(inner, ServiceSettings(cors_origins=LISTED, **settings))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc")


async def test_open_front_any_origin_without_credentials() -> None:
    async with _client() as http:
        pre = await http.options("/gradio/alpha/gradio_api/queue/join",
                                 headers={"Origin": "https://other.example", **ASK})  # fmt: skip
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == "https://other.example"
        assert pre.headers["access-control-allow-headers"] == "content-type, x-gradio-user"
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert "access-control-allow-credentials" not in pre.headers
        got = await http.post("/gradio/alpha/gradio_api/queue/join",
                              headers={"Origin": "https://other.example"})  # fmt: skip
        assert got.headers["access-control-allow-origin"] == "https://other.example"
        assert "access-control-allow-credentials" not in got.headers
        assert "Origin" in got.headers["vary"]
        listed = await http.get("/gradio/config", headers={"Origin": LISTED})
        assert listed.headers["access-control-allow-credentials"] == "true"


async def test_token_guarded_front_answers_listed_origins_only() -> None:
    async with _client(api_token="secret-token") as http:
        pre = await http.options("/gradio/alpha/config",
                                 headers={"Origin": "https://other.example", **ASK})  # fmt: skip
        assert pre.status_code == 403
        assert "access-control-allow-origin" not in pre.headers
        got = await http.get("/gradio/alpha/config", headers={"Origin": "https://other.example"})
        assert "access-control-allow-origin" not in got.headers
        pre = await http.options("/gradio/alpha/config", headers={"Origin": LISTED, **ASK})
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == LISTED
        assert pre.headers["access-control-allow-credentials"] == "true"


async def test_no_cors_outside_the_front() -> None:
    async with _client() as http:
        for path in ("/api/admin/pool-stats", "/api/predict", "/admin", "/gradiox"):
            pre = await http.options(path, headers={"Origin": LISTED, **ASK})
            assert "access-control-allow-origin" not in pre.headers
            got = await http.get(path, headers={"Origin": LISTED})
            assert "access-control-allow-origin" not in got.headers


async def test_odd_requested_headers_are_not_echoed() -> None:
    async with _client() as http:
        pre = await http.options("/gradio/config", headers={
            "Origin": "https://other.example", "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "x-ok, bad header\r"})  # fmt: skip
        assert pre.status_code == 200
        assert "access-control-allow-headers" not in pre.headers


def test_pages_setting() -> None:
    assert not ServiceSettings().pages_on
    on = ServiceSettings(gradio_pages="true")
    assert on.pages_on and on.pages_for(None) and on.pages_for("x")
    some = ServiceSettings(gradio_pages="alpha, chat")
    assert some.pages_on and some.pages_for("alpha") and not some.pages_for("beta")
    assert not some.pages_for(None)
    assert not ServiceSettings(gradio_pages="off").pages_on


# -- who may see a page ----------------------------------------------------------------------
def _pages_app(**settings: Any) -> httpx.AsyncClient:
    """The pages' refusal (off, or the API token missing) around a route that would
    serve the page."""
    from app.gradio._pages import _refusal

    async def page(request: Request) -> PlainTextResponse:
        refused = await _refusal(request)
        return refused or PlainTextResponse("served")  # type: ignore[return-value]

    inner = Starlette(routes=[Route("/gradio/{alias}/", page), Route("/gradio/{alias}/x.js", page)])
    inner.state.services = Services(ServiceSettings(**settings))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=inner), base_url="http://svc")


async def test_pages_off_say_how_to_turn_them_on() -> None:
    async with _pages_app(gradio_pages="chat") as http:
        off = await http.get("/gradio/alpha/")
        assert off.status_code == 404 and off.headers["content-type"].startswith("text/html")
        assert "POOL_GRADIO_PAGES" in off.text and "alpha" in off.text
        assert (await http.get("/gradio/alpha/x.js")).json() == {"detail": "Not Found"}
        assert (await http.get("/gradio/chat/")).text == "served"


async def test_a_page_behind_the_api_token_says_what_it_needs() -> None:
    async with _pages_app(gradio_pages="true", api_token="page-token-1") as http:
        refused = await http.get("/gradio/alpha/")
        assert refused.status_code == 401
        assert refused.headers["content-type"].startswith("text/html")
        assert "open front" in refused.text and "proxy" in refused.text
        assert "page-token-1" not in refused.text
        assert (await http.get("/gradio/alpha/x.js")).status_code == 401
        served = await http.get("/gradio/alpha/", headers={"Authorization": "Bearer page-token-1"})
        assert served.text == "served"


async def test_a_static_file_is_kept_or_streamed_by_its_size() -> None:
    """Small files kept (the Space asked once), a file past the bound streamed through
    whole and not kept, a 404 passed on."""
    from app.gradio._pages import CACHE_ENTRY_MAX_BYTES, _fetch

    asked: list[str] = []
    big = b"b" * (CACHE_ENTRY_MAX_BYTES + 70_000)

    def space(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == "/small.js":
            return httpx.Response(200, content=b"s" * 100,
                                  headers={"content-type": "text/javascript"})  # fmt: skip
        if request.url.path == "/big.js":  # no length: chunked
            return httpx.Response(200, content=chunked())
        return httpx.Response(404)

    async def chunked() -> AsyncIterator[bytes]:
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    async with httpx.AsyncClient(transport=httpx.MockTransport(space)) as http:

        class Pool:  # the pool's read of a Space's web files (Pool.space_web)
            @contextlib.asynccontextmanager
            async def space_web(self, name: str, path: str) -> AsyncIterator[httpx.Response]:
                request = http.build_request("GET", f"http://space/{path}")
                response = await http.send(request, stream=True)
                try:
                    yield response
                finally:
                    await response.aclose()

        fake: Any = Pool()
        cache = StaticCache()
        small = await _fetch(cache, ("s", "1", "small"), fake, "s", "small.js")
        assert small.body == b"s" * 100 and small.headers["content-type"] == "text/javascript"
        assert cache.get(("s", "1", "small")) is not None
        streamed = await _fetch(cache, ("s", "1", "big"), fake, "s", "big.js")
        chunks = streamed.body_iterator  # type: ignore[attr-defined]
        body = b"".join([bytes(c) async for c in chunks])
        assert body == big and cache.get(("s", "1", "big")) is None
        missing = await _fetch(cache, ("s", "1", "x"), fake, "s", "x.js")
        assert missing.status_code == 404
    assert asked == ["/small.js", "/big.js", "/x.js"]
