"""Revocation and ``daily_space_seconds`` reach accepted work (issue 38, F7 and F9).

* F7: a key revoked while its jobs wait: they end ``key_revoked`` before they run (the
  Space never sees them); the call already running finishes;
* F9: ``daily_space_seconds`` counts running calls as they run: a new call of the key
  is refused once used + running reaches the quota, while the long call still runs,
  and a job accepted before is refused once admitted.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from devspaces import SpaceFleet
from tests.service.conftest import ServiceFactory, ServiceProcess, admin_headers

pytestmark = pytest.mark.asyncio(loop_scope="module")
FINAL = {"done", "failed", "cancelled"}


@pytest.fixture(scope="module")
def service(start_service: ServiceFactory) -> ServiceProcess:
    return start_service()


def _key(service: ServiceProcess, **body: Any) -> dict[str, Any]:
    with httpx.Client(base_url=service.url, headers=admin_headers(), timeout=60) as admin:
        made = admin.post("/api/admin/keys", json=body)
    assert made.status_code == 201, made.text
    created: dict[str, Any] = made.json()
    return created


def _bearer(key: dict[str, Any]) -> dict[str, str]:
    return {"Authorization": f"Bearer {key['key']}"}


def _echo(text: str, delay_s: float) -> dict[str, Any]:
    return {"api_name": "/echo", "args": [text, delay_s], "space": "alpha"}


async def _final(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    """The job's view once final (read with the admin token: every team's jobs)."""
    deadline = time.monotonic() + 60
    while True:
        view: dict[str, Any] = (await client.get(url, headers=admin_headers())).json()
        if view["stage"] in FINAL:
            return view
        assert time.monotonic() < deadline, view
        await asyncio.sleep(0.1)


async def _running(client: httpx.AsyncClient, url: str) -> None:
    deadline = time.monotonic() + 60
    while (await client.get(url, headers=admin_headers())).json()["stage"] != "running":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_f7_a_revoked_keys_waiting_jobs_end_before_they_run(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """Limit 1: one job runs, two wait; the key is revoked: the running one finishes,
    the waiting ones end key_revoked and never reach the Space (before: they ran)."""
    key = _key(service, name="revoked-team", max_concurrent=1)
    async with service.client() as client:
        urls = []
        for text, delay in (("first", 2.0), ("second", 0.0), ("third", 0.0)):
            made = await client.post("/api/jobs", json=_echo(f"rv-{text}", delay),
                                     headers=_bearer(key))  # fmt: skip
            assert made.status_code == 202, made.text
            urls.append(made.json()["url"])
        await _running(client, urls[0])
        async with service.client(**admin_headers()) as admin:
            assert (await admin.delete(f"/api/admin/keys/{key['id']}")).status_code == 204
        views = [await _final(client, url) for url in urls]
    assert views[0]["stage"] == "done", views[0]
    for view in views[1:]:
        assert view["stage"] == "failed" and view["error"]["error"] == "key_revoked", view
    seen = [text for *_, text in await asyncio.to_thread(spaces["alpha"].calls)]
    assert "rv-first" in seen and not {"rv-second", "rv-third"} & set(seen), seen


async def test_f9_running_calls_count_against_daily_space_seconds(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """Quota 1 s: while a 4 s job runs, a new call of the key is refused 429 before the
    job ends; a job accepted before the quota was reached ends quota_daily_space_seconds
    once admitted (before: both ran, 2 s allowed and 20 s used)."""
    key = _key(service, name="quota-team", max_concurrent=2, daily_space_seconds=1)
    async with service.client() as client:
        long = await client.post("/api/jobs", json=_echo("q-long", 4.0), headers=_bearer(key))
        assert long.status_code == 202, long.text
        await _running(client, long.json()["url"])
        refused = None
        while refused is None:
            probe = await client.post("/api/predict", json=_echo("q-probe", 0.0),
                                      headers=_bearer(key))  # fmt: skip
            view = (await client.get(long.json()["url"], headers=admin_headers())).json()
            if probe.status_code == 429:
                refused = probe
            else:
                assert probe.status_code == 200, probe.text
                assert view["stage"] == "running", "the long job ended before any refusal"
                await asyncio.sleep(0.2)
        assert refused.json()["error"] == "quota_daily_space_seconds", refused.text
        assert view["stage"] == "running"  # refused while the long call still ran
        done = await _final(client, long.json()["url"])
        assert done["stage"] == "done"


async def test_f9_a_job_accepted_before_the_quota_is_refused_once_admitted(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """Limit 1, quota 1 s: a job accepted while the first (2.5 s) waits to run ends
    quota_daily_space_seconds once admitted, and never reaches the Space."""
    key = _key(service, name="queued-quota-team", max_concurrent=1, daily_space_seconds=1)
    async with service.client() as client:
        first = await client.post("/api/jobs", json=_echo("qq-first", 2.5), headers=_bearer(key))
        second = await client.post("/api/jobs", json=_echo("qq-second", 0.0), headers=_bearer(key))
        assert first.status_code == 202 and second.status_code == 202, second.text
        assert (await _final(client, first.json()["url"]))["stage"] == "done"
        view = await _final(client, second.json()["url"])
    assert view["stage"] == "failed", view
    assert view["error"]["error"] == "quota_daily_space_seconds", view
    seen = [text for *_, text in await asyncio.to_thread(spaces["alpha"].calls)]
    assert "qq-second" not in seen, seen


async def test_f7_a_revoked_keys_waiting_front_event_never_reaches_the_space(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """Front face, limit 1: one event runs, another waits for admission; the key is
    revoked: the running one finishes at the Space, the waiting one never starts there
    (before: it ran 7–13 s after the revocation)."""
    key = _key(service, name="revoked-front", max_concurrent=1)
    async with service.client(**_bearer(key)) as client:
        config = (await client.get("/gradio/alpha/config")).json()
        fn = next(d["id"] for d in config["dependencies"] if d["api_name"] == "echo")
        for text, delay in (("fr-first", 2.0), ("fr-second", 0.0)):
            body = {"data": [text, delay], "fn_index": fn, "session_hash": f"rv-{text}"}
            joined = await client.post("/gradio/alpha/gradio_api/queue/join", json=body)
            assert joined.status_code == 200, joined.text
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(lambda: spaces["alpha"].stats().in_flight):
            assert time.monotonic() < deadline, "the first event never started"
            await asyncio.sleep(0.05)
    async with service.client(**admin_headers()) as admin:
        assert (await admin.delete(f"/api/admin/keys/{key['id']}")).status_code == 204

    def texts() -> list[str]:
        return [text for *_, text in spaces["alpha"].calls()]

    deadline = time.monotonic() + 30
    while "fr-first" not in await asyncio.to_thread(texts):  # ended at the Space
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    window = time.monotonic() + 3.0  # the waiting event would start within ms of that
    while time.monotonic() < window:
        assert "fr-second" not in await asyncio.to_thread(texts)
        await asyncio.sleep(0.2)
