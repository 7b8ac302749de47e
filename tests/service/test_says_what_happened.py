"""APIs that say what happened (issue 41): a key's quota refusal on the Gradio front is
raised by gradio_client with the service's message and counted in the key's usage; a
front refusal before its route carries ``detail``; ``usage?key=`` of no key is a 404;
a session named without its owner says how sessions are named."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from devspaces import SpaceFleet

from .conftest import ServiceFactory, ServiceProcess, admin_headers, eventually


@pytest.fixture(scope="module")
def service(start_service: ServiceFactory) -> ServiceProcess:
    return start_service(POOL_MIN_CONNECTIONS="1")


async def _key(service: ServiceProcess, **body: Any) -> dict[str, Any]:
    async with service.client(**admin_headers()) as admin:
        made = await admin.post("/api/admin/keys", json=body)
    assert made.status_code == 201, made.text
    created: dict[str, Any] = made.json()
    return created


async def test_a_front_quota_refusal_is_the_services_message_and_counted_in_usage(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """daily_calls 1 through gradio_client: the first call answers, the second raises
    AppError with the quota's message (not a bare HTTP 429), the Space sees one call; the
    key's usage counts one call and one quota_daily_calls error."""
    space = next(iter(spaces))
    key = await _key(service, name="front-quota", max_concurrent=2, daily_calls=1)
    headers = {"Authorization": f"Bearer {key['key']}"}

    def calls() -> tuple[str, str]:
        client = Client(f"{service.url}/gradio/{space.name}/", headers=headers, verbose=False)
        try:
            first = str(client.predict("a", 0, api_name="/echo"))
            with pytest.raises(AppError) as refused:
                client.predict("b", 0, api_name="/echo")
            return first, str(refused.value)
        finally:
            client.close()

    await asyncio.to_thread(space.reset)
    first, message = await asyncio.to_thread(calls)
    assert first == f"{space.name}:a"
    assert "daily_calls quota" in message and "front-quota" in message, message
    assert (await asyncio.to_thread(space.stats)).total == 1

    async def counted() -> bool:
        async with service.client(**admin_headers()) as admin:
            hours = (await admin.get("/api/admin/usage?key=front-quota")).json()["hours"]
        errors = sum(h["errors"].get("quota_daily_calls", 0) for h in hours)
        return sum(h["calls"] for h in hours) == 1 and errors == 1

    await eventually(counted, 10, "the refusal counted in the key's usage")


async def test_front_refusals_carry_detail_and_unknown_usage_keys_are_404(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """A made-up key on the front: 401 with ``detail`` (what @gradio/client shows);
    a revoked key: 401 key_revoked naming it, on both faces; ``usage?key=`` of no key:
    404 key_not_found; of a revoked key: 200 (its usage)."""
    space = next(iter(spaces))
    async with service.client(Authorization="Bearer sp_made-up") as client:
        refused = await client.get(f"/gradio/{space.name}/config")
    assert refused.status_code == 401 and refused.json()["detail"], refused.text
    key = await _key(service, name="short-lived", max_concurrent=1)
    async with service.client(**admin_headers()) as admin:
        assert (await admin.delete(f"/api/admin/keys/{key['id']}")).status_code == 204
        unknown = await admin.get("/api/admin/usage?key=nope")
        revoked = await admin.get("/api/admin/usage?key=short-lived")
        listed = {k["id"]: k for k in (await admin.get("/api/admin/keys")).json()["keys"]}
    assert unknown.status_code == 404 and unknown.json()["error"] == "key_not_found"
    assert "nope" in unknown.json()["message"]
    assert revoked.status_code == 200
    shown = listed[key["id"]]
    assert shown["revoked"] is True and shown["revoked_at"].endswith("Z")
    assert isinstance(shown["created_at"], float) and shown["created"].endswith("Z")
    assert abs(shown["created_at"] - time.time()) < 600
    async with service.client(Authorization=f"Bearer {key['key']}") as client:
        json_api = await client.post("/api/predict", json={"api_name": "/echo", "args": ["x", 0]})
        front = await client.get(f"/gradio/{space.name}/config")
    for answer in (json_api, front):
        assert answer.status_code == 401 and answer.json()["error"] == "key_revoked", answer.text
        assert "'short-lived' was revoked" in answer.json()["message"]
    assert "revoked" in front.json()["detail"]


async def test_a_session_named_without_its_owner_says_how_sessions_are_named(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """GET and DELETE without ?email= of a session opened with one: 404 whose message
    says sessions are named with ?email= — the same words for a session that does not
    exist; the session stays open for its owner."""
    space = next(iter(spaces))
    async with service.client() as client:
        opened = await client.post("/api/sessions", json={"email": "owner@example.com",
                                                          "space": space.name})  # fmt: skip
        assert opened.status_code == 201, opened.text
        sid = opened.json()["session"]
        answers = [await client.get(f"/api/sessions/{sid}"),
                   await client.delete(f"/api/sessions/{sid}"),
                   await client.delete("/api/sessions/" + "x" * 22)]  # fmt: skip
        assert [a.status_code for a in answers] == [404, 404, 404]
        messages = {a.json()["message"] for a in answers}
        assert len(messages) == 1 and "?email=" in messages.pop()
        mine = await client.get(f"/api/sessions/{sid}?email=owner@example.com")
        assert mine.status_code == 200
        gone = await client.delete(f"/api/sessions/{sid}?email=owner@example.com")
        assert gone.status_code == 204
