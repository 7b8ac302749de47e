"""Teams isolated from each other (issue 38): identity is (key, user) on both faces.

One service with API keys A and B over the shared stand-in fleet, no ``POOL_API_TOKEN``
(a caller without a key is served too, as its own team):

* F1: an email that holds a key id and a ``/`` is not that key's user (the hash is of
  the length-prefixed pair, not of a joined string; the library's side:
  test_team_identity.py);
* F2: each key's anonymous callers are their own: B's anonymous caller does not read
  A's anonymous session (JSON API and front), and B's anonymous sessions do not count
  against A's;
* F8: a job belongs to the key that made it: another key's read, stream and cancel
  are answered 404, as an unknown id; the admin token reads every team's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from tests.service.conftest import ServiceFactory, ServiceProcess, admin_headers

pytestmark = pytest.mark.asyncio(loop_scope="module")
PER_USER = 2  # POOL_MAX_SESSIONS_PER_USER


def bearer(key: dict[str, Any], **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key['key']}", **headers}


@pytest.fixture(scope="module")
def service(start_service: ServiceFactory) -> ServiceProcess:
    return start_service(POOL_MAX_SESSIONS_PER_USER=str(PER_USER))


@pytest.fixture(scope="module")
def keys(service: ServiceProcess) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keys A and B, made once for the module."""
    made = []
    with httpx.Client(base_url=service.url, headers=admin_headers(), timeout=60) as admin:
        for name in ("team-a", "team-b"):
            response = admin.post("/api/admin/keys", json={"name": name, "max_concurrent": 4})
            assert response.status_code == 201, response.text
            made.append(response.json())
    return made[0], made[1]


async def _fn(client: httpx.AsyncClient, headers: dict[str, str]) -> int:
    config = (await client.get("/gradio/alpha/config", headers=headers)).json()
    return int(next(d["id"] for d in config["dependencies"] if d["api_name"] == "echo"))


async def _join(client: httpx.AsyncClient, headers: dict[str, str], tab: str) -> httpx.Response:
    fn = await _fn(client, headers)
    body = {"data": ["secret", 0], "fn_index": fn, "session_hash": tab}
    return await client.post("/gradio/alpha/gradio_api/queue/join", headers=headers, json=body)


async def _peek(client: httpx.AsyncClient, headers: dict[str, str], tab: str) -> int:
    response = await client.get("/gradio/alpha/gradio_api/queue/data", headers=headers,
                                params={"session_hash": tab})  # fmt: skip
    return response.status_code


async def test_f1_a_caller_without_a_key_cannot_pose_as_a_keys_user(
    service: ServiceProcess, keys: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """``"<key id>/bob@…"`` sent without a key neither reads A's bob's session (JSON
    API) nor joins or reads A's bob's front session (before: both, as bob)."""
    a, _ = keys
    forged = f"{a['id']}/bob@corp.example"
    async with service.client() as client:
        opened = await client.post("/api/sessions", headers=bearer(a),
                                   json={"email": "bob@corp.example"})  # fmt: skip
        assert opened.status_code == 201, opened.text
        session = opened.json()["session"]
        mine = await client.get(f"/api/sessions/{session}", headers=bearer(a),
                                params={"email": "bob@corp.example"})  # fmt: skip
        assert mine.status_code == 200
        other = await client.get(f"/api/sessions/{session}", params={"email": forged})
        assert other.status_code == 404, other.text
        gone = await client.delete(f"/api/sessions/{session}", params={"email": forged})
        assert gone.status_code == 404
        bob = bearer(a, **{"X-Spacepool-User": "bob@corp.example"})
        assert (await _join(client, bob, "bob-tab")).status_code == 200
        posing = {"X-Spacepool-User": forged}
        assert await _peek(client, posing, "bob-tab") == 404
        assert (await _join(client, posing, "bob-tab")).status_code == 404


async def test_f2_anonymous_callers_are_per_key(
    service: ServiceProcess, keys: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """B's anonymous caller does not read or end A's anonymous session (JSON API) nor
    read A's anonymous front session; B holding its anonymous sessions' limit does not
    refuse A's (before: all were one user, B read A's state and locked A out)."""
    a, b = keys
    async with service.client() as client:
        opened = await client.post("/api/sessions", headers=bearer(a), json={})
        assert opened.status_code == 201, opened.text
        session = opened.json()["session"]
        url = f"/api/sessions/{session}"
        assert (await client.get(url, headers=bearer(b))).status_code == 404
        assert (await client.delete(url, headers=bearer(b))).status_code == 404
        assert (await client.get(url)).status_code == 404  # no key
        assert (await client.get(url, headers=bearer(a))).status_code == 200
        assert (await client.delete(url, headers=bearer(a))).status_code == 204
        b_sessions = []
        for _ in range(PER_USER):
            made = await client.post("/api/sessions", headers=bearer(b), json={})
            assert made.status_code == 201, made.text
            b_sessions.append(made.json()["session"])
        refused = await client.post("/api/sessions", headers=bearer(b), json={})
        assert refused.status_code == 429  # B's own limit holds
        mine = await client.post("/api/sessions", headers=bearer(a), json={})
        assert mine.status_code == 201, mine.text
        for made_id in [*b_sessions]:
            await client.delete(f"/api/sessions/{made_id}", headers=bearer(b))
        await client.delete(f"/api/sessions/{mine.json()['session']}", headers=bearer(a))
        assert (await _join(client, bearer(a), "anon-tab")).status_code == 200
        assert await _peek(client, bearer(b), "anon-tab") == 404
        assert (await _join(client, bearer(b), "anon-tab")).status_code == 404


async def test_f8_a_job_is_its_keys_alone(
    service: ServiceProcess, keys: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """B (and a caller without a key) get 404 for A's job on read, events and cancel, as
    for an unknown id; A and the admin token read it (before: anyone with the id)."""
    a, b = keys
    async with service.client() as client:
        made = await client.post("/api/jobs", headers=bearer(a),
                                 json={"api_name": "/echo", "args": ["a-job", 0.0]})  # fmt: skip
        assert made.status_code == 202, made.text
        url = made.json()["url"]
        for others in (bearer(b), {}):
            assert (await client.get(url, headers=others)).status_code == 404
            assert (await client.get(f"{url}/events", headers=others)).status_code == 404
            assert (await client.delete(url, headers=others)).status_code == 404
        assert (await client.get(url, headers=bearer(a))).status_code == 200
        assert (await client.get(url, headers=admin_headers())).status_code == 200


async def test_f6_a_rest_result_is_recalled_only_under_its_own_scope(
    service: ServiceProcess, keys: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """A REST call made under ``/gradio/`` is unknown under ``/gradio/alpha/`` (and to
    another key), and read under its own scope (before: read under any scope)."""
    a, b = keys
    async with service.client() as client:
        made = await client.post("/gradio/gradio_api/call/echo", headers=bearer(a),
                                 json={"data": ["rest", 0]})  # fmt: skip
        assert made.status_code == 200, made.text
        event_id = made.json()["event_id"]
        other_scope = f"/gradio/alpha/gradio_api/call/echo/{event_id}"
        assert (await client.get(other_scope, headers=bearer(a))).status_code == 404
        own = f"/gradio/gradio_api/call/echo/{event_id}"
        assert (await client.get(own, headers=bearer(b))).status_code == 404
        read = await client.get(own, headers=bearer(a))
        assert read.status_code == 200 and "rest" in read.text, read.text


async def test_f5_a_key_under_its_share_of_the_front_is_never_refused(
    start_service: ServiceFactory,
) -> None:
    """POOL_GRADIO_MAX_SESSIONS=4, all held by B: A's first session is opened (one of
    B's ended for it), B's next is refused 503 (before: A refused while B held all)."""
    capped = start_service(POOL_GRADIO_MAX_SESSIONS="4")
    made = []
    async with capped.client(**admin_headers()) as admin:
        for name in ("share-a", "share-b"):
            body = {"name": name, "max_concurrent": 8}
            response = await admin.post("/api/admin/keys", json=body)
            assert response.status_code == 201, response.text
            made.append(response.json())
    a, b = made
    async with capped.client() as client:

        async def join(key: dict[str, Any], tab: str) -> int:
            return (await _join(client, bearer(key), tab)).status_code

        assert [await join(b, f"b-{i}") for i in range(4)] == [200] * 4
        assert await join(a, "a-0") == 200  # under its share (2): one of B's ends for it
        assert await join(a, "a-1") == 200
        assert await join(b, "b-9") == 503  # B holds its share (2): refused


async def test_f12_open_streams_per_caller_are_capped(start_service: ServiceFactory) -> None:
    """POOL_MAX_STREAMS_PER_CALLER=2: A's third open job-event stream is 429
    too_many_streams, and so are A's streamed predict and front REST result; B's are
    served; one of A's closed, A opens one again (before: no cap)."""
    capped = start_service(POOL_MAX_STREAMS_PER_CALLER="2")
    made = []
    async with capped.client(**admin_headers()) as admin:
        for name in ("streams-a", "streams-b"):
            body = {"name": name, "max_concurrent": 2}
            response = await admin.post("/api/admin/keys", json=body)
            assert response.status_code == 201, response.text
            made.append(response.json())
    a, b = made
    async with capped.client() as client:
        job = await client.post("/api/jobs", headers=bearer(a),
                                json={"api_name": "/echo", "args": ["long", 30.0]})  # fmt: skip
        url = job.json()["url"]
        async with client.stream("GET", f"{url}/events", headers=bearer(a)) as first:
            assert first.status_code == 200
            async with client.stream("GET", f"{url}/events", headers=bearer(a)) as second:
                assert second.status_code == 200
                third = await client.get(f"{url}/events", headers=bearer(a))
                assert third.status_code == 429, third.text
                assert third.json()["error"] == "too_many_streams"
                # Every SSE answer counts: a streamed predict and a front REST result too.
                streamed = await client.post("/api/predict", headers=bearer(a), json={
                    "api_name": "/echo", "args": ["s", 0], "stream": True})  # fmt: skip
                assert streamed.status_code == 429, streamed.text
                call = await client.post("/gradio/alpha/gradio_api/call/echo",
                                         headers=bearer(a), json={"data": ["r", 0]})
                assert call.status_code == 200, call.text
                result = await client.get(f"/gradio/alpha/gradio_api/call/echo/"
                                          f"{call.json()['event_id']}", headers=bearer(a))
                assert result.status_code == 429, result.text
                quick = {"api_name": "/echo", "args": ["b", 0]}
                theirs = await client.post("/api/jobs", headers=bearer(b), json=quick)
                events = await client.get(f"{theirs.json()['url']}/events", headers=bearer(b))
                assert events.status_code == 200  # B's streams are B's own count
                mine = await client.post("/api/predict", headers=bearer(b), json={
                    "api_name": "/echo", "args": ["s", 0], "stream": True})  # fmt: skip
                assert mine.status_code == 200 and "done" in mine.text, mine.text
        again = await client.get(url, headers=bearer(a))  # the cap does not touch reads
        assert again.status_code == 200
        deadline = time.monotonic() + 10  # given back once the server sees them closed
        while True:
            async with client.stream("GET", f"{url}/events", headers=bearer(a)) as reopened:
                if reopened.status_code == 200:
                    break
                assert reopened.status_code == 429 and time.monotonic() < deadline
            await asyncio.sleep(0.1)
        await client.delete(url, headers=bearer(a))


async def test_f12_the_fronts_root_comes_from_pool_public_url_not_the_host_header(
    start_service: ServiceFactory,
) -> None:
    """POOL_PUBLIC_URL set: a request naming another Host gets the config root and the
    login redirect under the public URL (before: under the caller's Host)."""
    public = start_service(POOL_PUBLIC_URL="https://pool.example.org/base")
    async with public.client(Host="evil.example") as client:
        config = (await client.get("/gradio/alpha/config")).json()
        assert config["root"] == "https://pool.example.org/base/gradio/alpha", config["root"]
        login = await client.post("/gradio/alpha/login", data={"username": "u", "password": "p"})
        assert login.status_code == 302
        assert login.headers["location"].startswith("https://pool.example.org/base/gradio")


async def test_f12_per_key_metrics_are_the_admins(
    service: ServiceProcess, keys: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """/metrics names no key and shows no key's usage without the admin token (before:
    to anyone); with it, the per-key series are there."""
    a, _ = keys
    async with service.client() as client:
        made = await client.post("/api/predict", headers=bearer(a),
                                 json={"api_name": "/echo", "args": ["m", 0]})  # fmt: skip
        assert made.status_code == 200, made.text
        anyone = (await client.get("/metrics")).text
        admin = (await client.get("/metrics", headers=admin_headers())).text
    assert "spacepool_key_" not in anyone and "team-a" not in anyone
    assert 'spacepool_key_calls_total{key="team-a"}' in admin


async def test_f12_key_names_are_unique(
    service: ServiceProcess, keys: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """A second live key called "team-a", or B renamed so, is 409 key_name_taken: no
    team appears under another's name in usage and metrics (before: 201)."""
    a, b = keys
    async with service.client(**admin_headers()) as admin:
        again = await admin.post("/api/admin/keys", json={"name": a["name"], "max_concurrent": 1})
        assert again.status_code == 409 and again.json()["error"] == "key_name_taken"
        renamed = await admin.patch(f"/api/admin/keys/{b['id']}", json={"name": a["name"]})
        assert renamed.status_code == 409
        same = await admin.patch(f"/api/admin/keys/{a['id']}", json={"name": a["name"]})
        assert same.status_code == 200, same.text


async def test_f12_a_name_is_taken_once_by_admins_at_once(service: ServiceProcess) -> None:
    """Eight creates of one new name at once (two admins, or one admin's retries): one
    201, seven 409 (before: the check read each worker's copy, and several were made);
    the name is free again once its key is revoked."""
    name = f"race-{time.monotonic_ns()}"
    async with service.client(**admin_headers()) as admin:
        made = await asyncio.gather(*(
            admin.post("/api/admin/keys", json={"name": name, "max_concurrent": 1})
            for _ in range(8)
        ))  # fmt: skip
        codes = sorted(r.status_code for r in made)
        assert codes == [201] + [409] * 7, [r.text for r in made]
        key_id = next(r.json()["id"] for r in made if r.status_code == 201)
        assert (await admin.delete(f"/api/admin/keys/{key_id}")).status_code in (200, 204)
        again = await admin.post("/api/admin/keys", json={"name": name, "max_concurrent": 1})
        assert again.status_code == 201, again.text


async def test_f10_front_uploads_count_in_the_keys_usage(
    service: ServiceProcess, keys: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """Two files uploaded to the front with key B: B's usage shows 2 uploads and their
    bytes (not calls), A's none of them; the CSV and /metrics carry them too (before:
    front uploads were in no usage)."""
    a, b = keys

    async def totals(admin: httpx.AsyncClient, key: str) -> tuple[int, int, int]:
        hours = (await admin.get("/api/admin/usage", params={"key": key})).json()["hours"]
        return (sum(h["uploads"] for h in hours), sum(h["upload_bytes"] for h in hours),
                sum(h["calls"] for h in hours))  # fmt: skip

    async with service.client(**admin_headers()) as admin:
        before_a, before_b = await totals(admin, a["id"]), await totals(admin, b["id"])
    async with service.client() as client:
        sent = await client.post(
            "/gradio/alpha/gradio_api/upload", headers=bearer(b),
            files=[("files", ("one.txt", b"x" * 1000, "text/plain")),
                   ("files", ("two.txt", b"y" * 234, "text/plain"))],
        )  # fmt: skip
        assert sent.status_code == 200, sent.text
    async with service.client(**admin_headers()) as admin:
        after_a, after_b = await totals(admin, a["id"]), await totals(admin, b["id"])
        csv_b = (await admin.get("/api/admin/usage", params={"key": b["id"], "format": "csv"}))
        metrics = (await admin.get("/metrics")).text
    assert after_b[0] - before_b[0] == 2 and after_b[1] - before_b[1] == 1234
    assert after_b[2] == before_b[2]  # an upload is not a call
    assert after_a == before_a
    assert "upload_bytes" in csv_b.text.splitlines()[0]
    assert 'spacepool_key_upload_bytes_total{key="team-b"}' in metrics
