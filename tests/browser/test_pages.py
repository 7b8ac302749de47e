"""The Spaces' own Gradio pages through the front, in a real browser (issue 42).

Debian's Chromium, driven by Playwright (as tests/service/test_dashboard.py), against
one real service over real stand-in Spaces: ``alpha`` and ``beta`` (text, the shared
fleet), ``chat`` (a streaming ``gr.ChatInterface``, history in ``gr.State``) and this
module's ``locked`` (files, behind Gradio's own login). Pages are on for every alias
but ``beta`` (``POOL_GRADIO_PAGES`` as a list). Every page test records each request
the browser makes and checks that none goes anywhere but the front (never a Space's
own address). One browser for the module, a fresh context (cookies, storage) per test.

These tests are the browser stage's (tests/browser/; every test here uses the
``browser`` fixture, which scripts/test's second stage selects): they need Chromium,
and skip without it (fail under ``CI=true``, as the dashboard's).
"""

from __future__ import annotations

import io
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from devspaces import LOGIN_USERS, SpaceFleet, SpaceProcess, free_port
from tests.front._spread import SpreadProxy
from tests.service.conftest import ServiceProcess, service_env
from tests.service.test_dashboard import CHROMIUM, CHROMIUM_ARGS, require_browser

ROOT = Path(__file__).resolve().parents[2]
CLIENT_JS = ROOT / "tests/front/js/node_modules/@gradio/client/dist/browser.js"
(POOL_USER, POOL_PASSWORD), (CALLER, CALLER_PASSWORD) = LOGIN_USERS
GLOBAL_CAP = 1  # one event at a time: a second one waits in the pool's queue
LISTED = "http://listed.example"
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def locked() -> Iterator[SpaceProcess]:
    """A file Space (kind image) behind Gradio's own login."""
    with SpaceProcess("locked", kind="image", login=True) as space:
        yield space


def _spaces(fleet: SpaceFleet, chat: SpaceProcess, locked: SpaceProcess) -> str:
    return f"{fleet.pool_spaces_env()},chat={chat.url},locked={locked.url}"


def _env(fleet: SpaceFleet, chat: SpaceProcess, locked: SpaceProcess, folder: Path,
         **extra: str) -> dict[str, str]:  # fmt: skip
    return service_env(
        _spaces(fleet, chat, locked), folder,
        POOL_GLOBAL_MAX_CONCURRENT=str(GLOBAL_CAP), POOL_QUEUE_TIMEOUT_S="60",
        POOL_SPACE_AUTH=f"locked={POOL_USER}:{POOL_PASSWORD}",
        POOL_GRADIO_PAGES="alpha,chat,locked", POOL_CORS_ORIGINS=LISTED, **extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def service(
    fleet: SpaceFleet, stream_spaces: dict[str, SpaceProcess], locked: SpaceProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServiceProcess]:  # fmt: skip
    folder = tmp_path_factory.mktemp("pages")
    service = ServiceProcess(_env(fleet, stream_spaces["chat"], locked, folder),
                             folder / "service.log")  # fmt: skip
    yield service
    service.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module (Debian's; Playwright never downloads one)."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            launched.close()


class Visit:
    """A fresh browser context; every URL it requested (:attr:`requested`)."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 900},
                                           service_workers="block")  # fmt: skip
        self.context.set_default_timeout(TIMEOUT_MS)
        self.requested: list[str] = []
        self.context.on("request", lambda request: self.requested.append(request.url))

    def page(self, url: str) -> Any:
        page = self.context.new_page()
        page.goto(url)
        return page

    def only_to(self, *origins: str) -> None:
        """Every request went to one of ``origins`` (or was the browser's own)."""
        allowed = {urllib.parse.urlsplit(o)[:2] for o in origins}
        stray = [u for u in self.requested
                 if urllib.parse.urlsplit(u)[:2] not in allowed
                 and not u.startswith(("data:", "blob:", "about:"))]  # fmt: skip
        assert not stray, f"requests beside the front: {stray[:5]}"


@pytest.fixture
def visit(browser: Any, fleet: SpaceFleet, stream_spaces: dict[str, SpaceProcess],
          locked: SpaceProcess) -> Iterator[Visit]:  # fmt: skip
    """A fresh context; afterwards, no request of it reached a Space's own address."""
    seen = Visit(browser)
    try:
        yield seen
    finally:
        seen.context.close()
    spaces = [s.url for s in fleet] + [stream_spaces["chat"].url, locked.url]
    hosts = {urllib.parse.urlsplit(u).netloc for u in spaces}
    reached = [u for u in seen.requested if urllib.parse.urlsplit(u).netloc in hosts]
    assert not reached, f"the page requested a Space's own address: {reached[:5]}"


def _expect() -> Any:
    from playwright.sync_api import expect

    return expect


# -- pages ---------------------------------------------------------------------------------
def test_text_app_page(service: ServiceProcess, visit: Visit, fleet: SpaceFleet,
                       browser: Any) -> None:  # fmt: skip
    """alpha's own page; its event runs through the pool (the Space counts it), as the
    browser's visitor: another browser is another user."""
    before = fleet["alpha"].stats().total
    other = Visit(browser)
    try:
        for seen, word in ((visit, "hello"), (other, "again")):
            page = seen.page(f"{service.url}/gradio/alpha/")
            expect = _expect()
            expect(page).to_have_title("stand-in Space alpha")
            page.get_by_label("text", exact=True).fill(word)
            page.get_by_role("button", name="echo", exact=True).click()
            expect(page.get_by_label("output", exact=True)).to_have_value(f"alpha:{word}")
            (cookie,) = [c for c in seen.context.cookies() if c["name"] == "spacepool-visitor"]
            assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"
            assert cookie["path"] == "/gradio"
            seen.only_to(service.url)
    finally:
        other.context.close()
    assert fleet["alpha"].stats().total == before + 2
    joins = [line for line in service.log_lines()
             if str(line.get("path")).endswith("/queue/join") and line.get("space") == "alpha"]
    assert len({line.get("user") for line in joins[-2:]} - {None}) == 2  # two visitors


def test_streaming_chat_keeps_its_state(service: ServiceProcess, visit: Visit) -> None:
    """A ChatInterface (its reply streamed, its history in gr.State; its clearing steps
    run outside the queue, through ``run``): three turns, each remembering the last."""
    page = visit.page(f"{service.url}/gradio/chat/")
    expect = _expect()
    box = page.get_by_role("textbox").first
    for i, word in enumerate(["a", "b", "c"]):
        box.fill(word)
        box.press("Enter")
        earlier = " | ".join(["a", "b", "c"][:i]) or "(nothing)"
        expect(page.get_by_text(f"heard '{word}'; earlier: {earlier}")).to_be_visible()
    visit.only_to(service.url)
    # The steps run outside the queue reached the Space through run/, as pool calls of
    # the page's visitor (one user: the visitor cookie's), like its queued events.
    lines = [line for line in service.log_lines() if line.get("space") == "chat"]
    runs = [line for line in lines if str(line.get("path")).endswith("/run/{api_name}")]
    joins = [line for line in lines if str(line.get("path")).endswith("/queue/join")]
    assert len(joins) >= 3 and len(runs) >= 3
    assert {line["status"] for line in runs + joins} == {200}
    assert len({line.get("user") for line in runs + joins} - {None}) == 1


def test_login_page_then_image_upload(service: ServiceProcess, visit: Visit, tmp_path: Path,
                                      locked: SpaceProcess) -> None:  # fmt: skip
    """A Space behind Gradio's login: its login form, the front's login, then the app:
    an image uploaded, flipped by the Space, shown from the front."""
    page = visit.page(f"{service.url}/gradio/locked/")
    expect = _expect()
    for password in ("wrong-password", CALLER_PASSWORD):  # Gradio's form says which
        page.get_by_label(re.compile("username", re.I)).fill(CALLER)
        page.get_by_label(re.compile("password", re.I)).fill(password)
        page.get_by_role("button", name=re.compile("login", re.I)).click()
        if password != CALLER_PASSWORD:
            expect(page.get_by_text(re.compile("incorrect credentials", re.I))).to_be_visible()
    expect(page.get_by_role("button", name="flip", exact=True)).to_be_visible()
    image = tmp_path / "dot.png"
    image.write_bytes(_png())
    page.locator("input[type=file]").first.set_input_files(str(image))
    page.get_by_role("button", name="flip", exact=True).click()
    # The output (the input's preview is our upload: spacepool-upload/…).
    flipped = page.locator("img[src*='gradio_api/file=']:not([src*='spacepool-upload'])")
    expect(flipped.first).to_be_visible()
    src = flipped.first.get_attribute("src") or ""
    assert src.startswith(f"{service.url}/gradio/locked/gradio_api/file="), src
    shown = visit.context.request.get(src)  # with the page's cookies, as the <img> got it
    assert shown.status == 200
    from PIL import Image

    pixels = Image.open(io.BytesIO(shown.body())).convert("RGB")
    assert [pixels.getpixel((x, 0)) for x in range(2)] == [(0, 0, 255), (255, 0, 0)]
    visit.only_to(service.url)


def test_an_event_queued_by_the_pool_shows_its_place(
    service: ServiceProcess, visit: Visit, fleet: SpaceFleet
) -> None:  # fmt: skip
    """With the global cap (1) taken by another caller, the page's event waits in the
    pool's queue: the page shows its place (Gradio's queue display), then the result."""
    page = visit.page(f"{service.url}/gradio/alpha/")
    expect = _expect()
    expect(page.get_by_role("button", name="echo", exact=True)).to_be_visible()
    done = threading.Event()

    def hold() -> None:  # the cap's one slot, for 4 s
        try:
            httpx.post(f"{service.url}/api/predict", timeout=60, json={
                "space": "beta", "api_name": "/echo", "args": ["held", 4]})  # fmt: skip
        finally:
            done.set()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        _until(lambda: fleet["beta"].stats().in_flight == 1, 20, "beta holds the cap")
        page.get_by_label("text", exact=True).fill("waited")
        page.get_by_role("button", name="echo", exact=True).click()
        expect(page.get_by_text(re.compile(r"queue:\s*1\s*/\s*1"))).to_be_visible()
        assert not done.is_set()
        expect(page.get_by_label("output", exact=True)).to_have_value("alpha:waited")
        assert done.is_set()  # ran once the slot was free
    finally:
        holder.join(60)
    visit.only_to(service.url)


def test_a_page_on_another_origin_uses_gradio_client(service: ServiceProcess,
                                                     visit: Visit) -> None:  # fmt: skip
    """A page served from another origin (localhost, another port) imports
    @gradio/client, predicts and streams a chat reply through the front (CORS, no
    credentials)."""
    if not CLIENT_JS.is_file():
        pytest.skip("@gradio/client is not installed (cd tests/front/js && npm ci)")
    with _OtherOrigin(service.url) as other:
        page = visit.page(other.url + "/index.html")
        _expect()(page.locator("#out")).to_have_text(
            "alpha:from afar / heard 'hi'; earlier: (nothing)", timeout=TIMEOUT_MS)
        visit.only_to(service.url, other.url)


def test_the_pools_page_behind_a_round_robin_proxy(
    fleet: SpaceFleet, visit: Visit, tmp_path: Path
) -> None:  # fmt: skip
    """``/gradio/``'s page (the pool over alpha and beta, replicas of one app) with every
    request spread over two service processes in turn (one SQLite coordinator, no sticky
    sessions): the page's events stay on the Space its session was pinned to."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    workers = []
    try:
        for i in range(2):
            folder = tmp_path / f"w{i}"
            folder.mkdir()
            env = service_env(fleet, folder, POOL_COORDINATOR_URL=url, POOL_GRADIO_PAGES="true",
                              POOL_FILE_DIR=str(tmp_path / "files"))  # fmt: skip
            workers.append(ServiceProcess(env, folder / "service.log"))
        with SpreadProxy([w.url for w in workers]) as proxy:
            page = visit.page(f"{proxy.url}/gradio/")
            expect = _expect()
            output = page.get_by_label("output", exact=True)
            spaces = []
            for word in ["one", "two"]:
                page.get_by_label("text", exact=True).fill(word)
                page.get_by_role("button", name="echo", exact=True).click()
                try:  # two more services on a loaded machine: a longer wait
                    expect(output).to_have_value(re.compile(f"^(alpha|beta):{word}$"),
                                                 timeout=2 * TIMEOUT_MS)  # fmt: skip
                except AssertionError as exc:  # what each worker saw, for the report
                    logs = "\n".join(w.log_text()[-2000:] for w in workers)
                    raise AssertionError(f"{exc}\nsent: {proxy.sent}\n{logs}") from None
                spaces.append(output.input_value().split(":")[0])
            assert spaces[0] == spaces[1]  # the session's Space
            assert proxy.served("join") == {0, 1}  # the page's two events, one on each
            assert proxy.served("data") == {0, 1}
            visit.only_to(proxy.url)
    finally:
        for worker in workers:
            worker.stop()


def test_the_dashboard_keeps_the_token_in_memory_while_pages_are_on(
    service: ServiceProcess, visit: Visit
) -> None:  # fmt: skip
    """Pages on: the admin token is asked at each visit, never stored."""
    from tests.service.conftest import ADMIN_TOKEN

    page = visit.page(f"{service.url}/admin")
    expect = _expect()
    page.locator("#token").fill(ADMIN_TOKEN)
    page.locator("#token").press("Enter")
    expect(page.locator("#dashboard")).to_be_visible()
    stored = page.evaluate("() => [sessionStorage.length, localStorage.length, document.cookie]")
    assert stored == [0, 0, ""]
    page.reload()
    expect(page.locator("#token")).to_be_visible()
    expect(page.locator("#dashboard")).to_be_hidden()


# -- without a browser ----------------------------------------------------------------------
@pytest.mark.usefixtures("browser")  # with the module's service: in the browser stage
def test_pages_off_answer_a_short_page(service: ServiceProcess) -> None:
    """beta is not in POOL_GRADIO_PAGES: an HTML page saying how, not a JSON 404; its
    files are not served; its API still is."""
    page = httpx.get(f"{service.url}/gradio/beta/")
    assert page.status_code == 404
    assert page.headers["content-type"].startswith("text/html")
    assert "POOL_GRADIO_PAGES" in page.text and "beta" in page.text
    assert httpx.get(f"{service.url}/gradio/beta/theme.css").status_code == 404
    assert httpx.get(f"{service.url}/gradio/beta/config").status_code == 200
    assert httpx.get(f"{service.url}/gradio/beta", follow_redirects=True).status_code == 404


@pytest.mark.usefixtures("browser")
def test_the_pages_files_are_the_spaces(service: ServiceProcess, fleet: SpaceFleet) -> None:
    """The page's files come from the Space (the same bytes), kept by the service; a
    path that would leave its route, or a file the Space has not, is 404."""
    base = f"{service.url}/gradio/alpha"
    space = fleet["alpha"].url.rstrip("/")
    for path in ("/theme.css", "/manifest.json", "/favicon.ico", "/static/img/logo.svg"):
        ours, theirs = httpx.get(base + path), httpx.get(space + path)
        assert ours.status_code == theirs.status_code, path
        if theirs.status_code == 200:
            assert ours.content == theirs.content, path
            assert ours.headers["x-content-type-options"] == "nosniff"
    assert httpx.head(base + "/").status_code == 200
    for path in ("/assets/..%2f..%2fconfig", "/assets/%2e%2e/x.js", "/static/a\\b.js",
                 "/assets/missing-xyz.js", "/gradio_api/custom_component/x/client/y/z.js"):
        assert httpx.get(base + path).status_code == 404, path


@pytest.mark.usefixtures("browser")
def test_cors_and_urls_of_the_running_service(service: ServiceProcess) -> None:
    """Preflight from any origin on the open front (no credentials); a listed origin
    with credentials; admin routes answer no CORS at all. The config's root is
    absolute, a login redirect a path."""
    ask = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "content-type,x-gradio-user"}  # fmt: skip
    join = f"{service.url}/gradio/alpha/gradio_api/queue/join"
    anyone = httpx.options(join, headers={"Origin": "http://elsewhere.example", **ask})
    assert anyone.status_code == 200
    assert anyone.headers["access-control-allow-origin"] == "http://elsewhere.example"
    assert anyone.headers["access-control-allow-headers"] == "content-type,x-gradio-user"
    assert "access-control-allow-credentials" not in anyone.headers
    listed = httpx.options(join, headers={"Origin": LISTED, **ask})
    assert listed.headers["access-control-allow-credentials"] == "true"
    config = httpx.get(f"{service.url}/gradio/alpha/config", headers={"Origin": LISTED})
    assert config.headers["access-control-allow-origin"] == LISTED
    assert config.json()["root"] == f"{service.url}/gradio/alpha"  # absolute: the clients'
    # A redirect is a path (POOL_PUBLIC_URL unset), whatever Host the caller names.
    login = httpx.post(f"{service.url}/gradio/alpha/login", headers={"Host": "evil.example"},
                       data={"username": "u", "password": "p"})  # fmt: skip
    assert login.status_code == 302 and login.headers["location"] == "/gradio/alpha"
    # The admin token opens admin routes only as a bearer header: never a cookie or query.
    from tests.service.conftest import ADMIN_TOKEN

    stats = f"{service.url}/api/admin/pool-stats"
    assert httpx.get(stats, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 200
    assert httpx.get(stats, params={"token": ADMIN_TOKEN}).status_code == 401
    assert httpx.get(stats, headers={"Cookie": f"token={ADMIN_TOKEN}"}).status_code == 401
    for path in ("/api/admin/pool-stats", "/api/predict"):
        admin = httpx.options(service.url + path, headers={"Origin": LISTED, **ask})
        assert "access-control-allow-origin" not in admin.headers
        got = httpx.get(service.url + path, headers={"Origin": LISTED})
        assert "access-control-allow-origin" not in got.headers


# -- helpers ----------------------------------------------------------------------------------
def _until(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s} s")
        time.sleep(0.05)


def _png() -> bytes:
    """A 2x1 PNG (red, blue): flipped, blue then red."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    raw = b"\x00" + bytes([255, 0, 0, 0, 0, 255])
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))  # fmt: skip


_PAGE = """<!doctype html><meta charset=utf-8><title>elsewhere</title><p id=out>…</p>
<script type=module>
import { Client } from "./client.js";
const out = document.getElementById("out");
try {
  const app = await Client.connect("%(front)s/gradio/alpha/");
  const result = await app.predict("/echo", ["from afar", 0]);
  const chat = await Client.connect("%(front)s/gradio/chat/");
  let reply = "";
  for await (const msg of chat.submit("/chat", ["hi"])) {  // streamed, message by message
    if (msg.type === "data") reply = msg.data[0];
    if (msg.type === "status" && msg.stage === "complete") break;
    if (msg.type === "status" && msg.stage === "error") throw new Error(msg.message);
  }
  out.textContent = result.data[0] + " / " + reply;
} catch (e) { out.textContent = "failed: " + (e && e.message || e); }
</script>"""


class _OtherOrigin:
    """A static site on http://localhost:<port> (another origin than the service's
    127.0.0.1): ``index.html`` and @gradio/client's browser build as ``client.js``."""

    def __init__(self, front: str) -> None:
        page = (_PAGE % {"front": front}).encode()
        self.files = {"/index.html": page, "/client.js": CLIENT_JS.read_bytes()}
        self.port = free_port()
        self.url = f"http://localhost:{self.port}"
        files = self.files

        class Handler(SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                body = files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                kind = "text/html" if self.path.endswith(".html") else "text/javascript"
                self.send_response(200)
                self.send_header("Content-Type", f"{kind}; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _OtherOrigin:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

