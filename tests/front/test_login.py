"""The front of a Space behind Gradio's own login (``auth=``): ``config`` and every other
route answer ``login_check``'s 401 until ``Client(url, auth=...)`` logs in (the Space
checks the credentials; the front issues its own cookie); then a file goes up, through
the app and back down. ``/api/predict`` runs on the pool's own login; a wrong password
is a 401; no password reaches a log, the pool's stats or an error."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AuthenticationError
from PIL import Image

from devspaces import LOGIN_USERS, SpaceProcess
from tests.service.conftest import ServiceProcess, admin_headers, service_env

from .conftest import API_TOKEN, AUTH

JS_DIR = Path(__file__).parent / "js"

(POOL_USER, POOL_PASSWORD), (CALLER, CALLER_PASSWORD) = LOGIN_USERS
WRONG = "wrong-password-73be0c"
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def locked() -> Iterator[SpaceProcess]:
    """An image/file stand-in Space behind Gradio's login."""
    with SpaceProcess("locked", kind="image", login=True) as space:
        yield space


@pytest.fixture(scope="module")
def service(
    locked: SpaceProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """The locked Space (with the pool's login) behind POOL_API_TOKEN."""
    folder = tmp_path_factory.mktemp("front-login")
    env = service_env(f"locked={locked.url}", folder, POOL_API_TOKEN=API_TOKEN,
                      POOL_SPACE_AUTH=f"locked={POOL_USER}:{POOL_PASSWORD}")  # fmt: skip
    service = ServiceProcess(env, folder / "service.log")
    yield service
    service.stop()


def _front(service: ServiceProcess, **kw: object) -> Client:
    return Client(f"{service.url}/gradio/locked/", verbose=False, headers=AUTH, **kw)  # type: ignore[arg-type]


def _png(tmp_path: Path) -> Path:
    image = Image.new("RGB", (5, 2))
    image.putpixel((0, 1), (0, 200, 0))
    path = tmp_path / "in.png"
    image.save(path)
    return path


def test_a_client_without_credentials_gets_authentication_error(service: ServiceProcess) -> None:
    """No login: gradio_client raises AuthenticationError, as from the Space itself."""
    with pytest.raises(AuthenticationError):
        _front(service)


def test_a_logged_in_client_round_trips_a_file(service: ServiceProcess, tmp_path: Path) -> None:
    """Client(auth=(user, password)): the Space accepts the caller's login; an upload,
    the predict and the download of its output file all pass the front's check."""
    front = _front(service, auth=(CALLER, CALLER_PASSWORD), download_files=str(tmp_path))
    try:
        assert not any("access-token" in name for name in front.cookies)  # ours, not the Space's
        source = _png(tmp_path)
        flipped = front.predict(handle_file(str(source)), api_name="/flip")
        with Image.open(flipped) as image:
            assert image.getpixel((4, 1)) == (0, 200, 0)
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        assert front.predict(handle_file(str(source)), api_name="/checksum").endswith(digest)
    finally:
        front.close()


def test_wrong_credentials_are_a_401(service: ServiceProcess) -> None:
    """A password the Space refuses: 401 (gradio_client: AuthenticationError); a login
    without its fields is a 422; neither is a 500."""
    with pytest.raises(AuthenticationError):
        _front(service, auth=(CALLER, WRONG))
    with httpx.Client(base_url=f"{service.url}/gradio/locked", timeout=DEADLINE_S) as http:
        wrong = http.post("/login", data={"username": CALLER, "password": WRONG})
        assert wrong.status_code == 401 and wrong.json() == {"detail": "Incorrect credentials."}
        assert "set-cookie" not in wrong.headers
        assert http.post("/login", data={"username": CALLER}).status_code == 422
        assert http.post("/login", content=b"\xff garbage",
                         headers={"content-type": "multipart/form-data; boundary=x"}
                         ).status_code < 500  # fmt: skip


def test_repeated_failed_logins_are_held_for_that_caller_and_user(service: ServiceProcess) -> None:
    """FAILURES_MAX wrong passwords for one user from one address: the next login as that
    user — even with the right password — is a 429 with Retry-After; another user from
    the same address still logs in (app/gradio/_login.py)."""
    from app.gradio._login import FAILURE_WINDOW_S, FAILURES_MAX

    with httpx.Client(base_url=f"{service.url}/gradio/locked", timeout=DEADLINE_S) as http:
        for _ in range(FAILURES_MAX):
            wrong = http.post("/login", data={"username": POOL_USER, "password": WRONG})
            assert wrong.status_code == 401, wrong.text
        held = http.post("/login", data={"username": POOL_USER, "password": POOL_PASSWORD})
        assert held.status_code == 429, held.text
        assert held.headers["retry-after"] == str(int(FAILURE_WINDOW_S))
        assert "set-cookie" not in held.headers
        other = http.post("/login", data={"username": CALLER, "password": CALLER_PASSWORD})
        assert other.status_code == 200, other.text


def test_no_route_of_the_scope_is_open_without_the_login(service: ServiceProcess) -> None:
    """Without a valid cookie every route answers login_check's 401 (no way around the
    login); a forged, expired or other scope's cookie is refused too."""
    base = f"{service.url}/gradio/locked"
    with httpx.Client(base_url=base, headers=AUTH, timeout=DEADLINE_S) as http:
        routes = [("GET", "/config"), ("GET", "/gradio_api/info"),
                  ("POST", "/gradio_api/queue/join"), ("GET", "/gradio_api/queue/data"),
                  ("POST", "/gradio_api/upload"), ("GET", "/gradio_api/file=x.png"),
                  ("POST", "/gradio_api/call/echo")]  # fmt: skip
        for method, path in routes:
            answer = http.request(method, path, json={"data": ["x", 0], "session_hash": "s"})
            assert answer.status_code == 401, (path, answer.text)
            assert answer.json()["detail"]["error"] == "Not authenticated"
        assert http.get(f"{service.url}/gradio/config").status_code == 401  # the pool's scope
        logged = http.post("/login", data={"username": CALLER, "password": CALLER_PASSWORD})
        assert logged.status_code == 200 and logged.json() == {"success": True}
        good = logged.cookies["spacepool-login-locked"]
        http.cookies.clear()  # each request below sends the cookie it names, no other
        expiry, _, mac = good.partition(".")
        for cookie in (f"{expiry}.{'0' * len(mac)}", f"{int(expiry) - 10**6}.{mac}", "x"):
            answer = http.get("/config", cookies={"spacepool-login-locked": cookie})
            assert answer.status_code == 401
        assert http.get("/config", cookies={"spacepool-login": good}).status_code == 401
        assert http.get("/config", cookies={"spacepool-login-locked": good}).status_code == 200
        out = http.get("/logout", cookies={"spacepool-login-locked": good})
        assert out.status_code == 302 and "spacepool-login-locked" in out.headers["set-cookie"]
        pool_scope = f"{service.url}/gradio"  # the pool's scope: its own login and cookie
        logged = http.post(
            f"{pool_scope}/login", data={"username": CALLER, "password": CALLER_PASSWORD}
        )
        assert logged.status_code == 200 and "spacepool-login" in logged.cookies
        http.cookies.clear()
        cookie = {"spacepool-login": logged.cookies["spacepool-login"]}
        assert http.get(f"{pool_scope}/config", cookies=cookie).status_code == 200
        assert http.get("/config", cookies=cookie).status_code == 401


@pytest.mark.skipif(shutil.which("node") is None, reason="no Node.js on this machine")
def test_gradio_js_client_logs_in(service: ServiceProcess, tmp_path: Path) -> None:
    """@gradio/client: refused without auth, then Client.connect(url, {auth}) uploads a
    file and gets the Space's checksum of it."""
    if not (JS_DIR / "node_modules" / "@gradio" / "client").is_dir():
        pytest.fail("tests/front/js/node_modules missing: scripts/test runs npm ci there")
    upload = tmp_path / "in.bin"
    upload.write_bytes(os.urandom(2000))
    url = f"{service.url}/gradio/locked/"
    done = subprocess.run(
        ["node", str(JS_DIR / "login.mjs"), url, CALLER, CALLER_PASSWORD, str(upload)],
        cwd=JS_DIR, env={**os.environ, "SPACEPOOL_HEADERS": json.dumps(AUTH)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # login_check's 401 body, read as from the Space (init_helpers.ts handleConfigResponse)
    assert result["refused"] == "Login credentials are required to access this space."
    assert result["checksum"] == [f"2000 {hashlib.sha256(upload.read_bytes()).hexdigest()}"]


async def test_api_predict_runs_on_the_pools_login_and_no_password_leaks(
    service: ServiceProcess,
) -> None:
    """/api/predict works with POOL_SPACE_AUTH's login; after every test above, neither
    password (nor the wrong one) is in the service's log or /api/admin/pool-stats."""
    async with service.client() as http:
        done = await http.post("/api/predict", headers=AUTH,
                               json={"api_name": "/echo", "args": ["hi", 0]})  # fmt: skip
        assert done.status_code == 200, done.text
        assert done.json()["result"] == "locked:hi"
        stats = await http.get("/api/admin/pool-stats", headers=admin_headers())
        assert stats.status_code == 200
    seen = [json.dumps(stats.json()), service.log_text()]
    assert not [t for t in seen if any(p in t for p in (POOL_PASSWORD, CALLER_PASSWORD, WRONG))]


def test_a_wrong_pool_login_is_a_clear_error_not_a_500(
    locked: SpaceProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """POOL_SPACE_AUTH with a password the Space refuses: /api/predict and the front
    answer 502 naming the credentials (no 500, no hang); the password is nowhere."""
    folder = tmp_path_factory.mktemp("front-login-wrong")
    env = service_env(f"locked={locked.url}", folder, POOL_SPACE_AUTH=f"locked={POOL_USER}:{WRONG}")
    service = ServiceProcess(env, folder / "service.log")
    try:
        with httpx.Client(base_url=service.url, timeout=DEADLINE_S) as http:
            done = http.post("/api/predict", json={"api_name": "/echo", "args": ["hi", 0]})
            assert done.status_code == 502 and "credentials" in done.text, done.text
            config = http.get("/gradio/locked/config")
            assert config.status_code in (401, 502), config.text
            seen = [done.text, config.text, http.get("/api/admin/pool-stats",
                                                     headers=admin_headers()).text]  # fmt: skip
    finally:
        service.stop()
    seen.append(service.log_text())
    assert not [text for text in seen if WRONG in text]
