"""The front's login limit cannot be raced (issue 38, F3), over a Space behind Gradio's
login (``POOL_SPACE_AUTH``) of this module's own.

A guess takes its place in the count before the Space is asked, atomically: of 40
wrong guesses sent at once, at most ``FAILURES_MAX`` reach the Space (each one it
judged is a 401; the rest are 429 before it is asked). The username is normalized
(case variants count together), the scopes leading to one Space count together, and an
address has a limit across usernames too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from app.gradio._login import ADDRESS_FAILURES_MAX, FAILURES_MAX
from devspaces import LOGIN_USERS, SpaceProcess
from tests.service.conftest import ServiceProcess, service_env

pytestmark = pytest.mark.asyncio(loop_scope="module")
(POOL_USER, POOL_PASSWORD), (CALLER, CALLER_PASSWORD) = LOGIN_USERS
WRONG = "wrong-password-0d41aa"


@pytest.fixture(scope="module")
def guarded() -> Iterator[SpaceProcess]:
    with SpaceProcess("guarded", login=True) as space:
        yield space


@pytest.fixture(scope="module")
def service(
    guarded: SpaceProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    folder = tmp_path_factory.mktemp("team-login")
    env = service_env(f"guarded={guarded.url}", folder,
                      POOL_SPACE_AUTH=f"guarded={POOL_USER}:{POOL_PASSWORD}")  # fmt: skip
    started = ServiceProcess(env, folder / "service.log")
    yield started
    started.stop()


async def _login(http: httpx.AsyncClient, path: str, username: str, password: str) -> int:
    answer = await http.post(path, data={"username": username, "password": password})
    return answer.status_code


async def test_f3_concurrent_guesses_reach_the_space_at_most_the_limit(
    service: ServiceProcess,
) -> None:
    """40 wrong guesses for one user at once: at most FAILURES_MAX are judged by the
    Space (401), every other one is 429 (before: 22 of 40 reached the Space)."""
    async with service.client() as http:
        codes = await asyncio.gather(
            *(_login(http, "/gradio/guarded/login", "racer", WRONG) for _ in range(40))
        )
    assert set(codes) <= {401, 429}, codes
    assert codes.count(401) <= FAILURES_MAX, codes
    assert codes.count(429) >= 40 - FAILURES_MAX


async def test_f3_case_variants_and_other_scopes_share_the_count(
    service: ServiceProcess,
) -> None:
    """FAILURES_MAX failures as "Alice": "ALICE", "alice" and the login through the
    other scope leading to the same Space (``/gradio/login``) are held, even with the
    right password (before: each variant and scope had its own 10)."""
    async with service.client() as http:
        for _ in range(FAILURES_MAX):
            assert await _login(http, "/gradio/guarded/login", "Alice", WRONG) == 401
        for variant in ("ALICE", "alice", "\uff21lice"):  # the last: a fullwidth A (NFKC)
            assert await _login(http, "/gradio/guarded/login", variant, WRONG) == 429
        assert await _login(http, "/gradio/login", CALLER, WRONG) == 429
        assert await _login(http, "/gradio/login", CALLER, CALLER_PASSWORD) == 429


async def test_f3_an_address_is_limited_across_usernames(service: ServiceProcess) -> None:
    """Fresh usernames from one address: once ADDRESS_FAILURES_MAX failures are counted
    for it, a new username is held too (before: each username had its own 10)."""
    async with service.client() as http:
        codes = [
            await _login(http, "/gradio/guarded/login", f"user{i}", WRONG)
            for i in range(ADDRESS_FAILURES_MAX)
        ]
    assert codes.count(429) >= 1, codes  # the earlier tests' failures count here too
    assert codes[-1] == 429


async def test_f6_the_json_api_does_not_open_a_guarded_space_to_open_callers(
    service: ServiceProcess,
) -> None:
    """No POOL_API_TOKEN, no key: /api/predict and /api/jobs on the Space behind the
    login are 403 space_login_required, nothing run (before: run on the pool's login);
    with an API key the operator made, the call runs."""
    from tests.service.conftest import admin_headers

    body = {"api_name": "/echo", "args": ["f6", 0]}
    async with service.client() as http:
        refused = await http.post("/api/predict", json=body)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"] == "space_login_required"
        job = await http.post("/api/jobs", json=body)
        assert job.status_code == 202
        url = job.json()["url"]
        for _ in range(300):
            view = (await http.get(url)).json()
            if view["stage"] in ("done", "failed", "cancelled"):
                break
            await asyncio.sleep(0.1)
        assert view["stage"] == "failed" and view["error"]["error"] == "space_login_required"
        made = await http.post("/api/admin/keys", headers=admin_headers(),
                               json={"name": "allowed", "max_concurrent": 1})  # fmt: skip
        keyed = {"Authorization": f"Bearer {made.json()['key']}"}
        done = await http.post("/api/predict", json=body, headers=keyed)
        assert done.status_code == 200, done.text
