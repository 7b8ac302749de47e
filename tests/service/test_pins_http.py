"""A user keeps one Space through the service (issue 37): two service processes over one
SQLite coordinator, a fleet shaped like ``scripts/run``'s demo (an echo app with two
replicas, a chat, a files app).

* 5 users x 8 calls at once, each user's calls spread over both processes: every user
  is served by exactly one replica (the Spaces' own records).
* Sessions opened without a Space are unpinned (``space: null``) and routed by their
  first call: 6 of 6 continue their conversation on the chat app, through the JSON API
  and through the library; a session bound to an app (``api_name``) refuses another
  app's endpoint with a 422 naming its app and endpoints.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from devspaces import SpaceProcess
from pool import Pool, PoolSettings, UnknownEndpoint
from tests.conftest import spaces_env

from .conftest import ServiceFactory, ServiceProcess

KINDS = {"alpha": "echo", "alpha2": "echo", "chat": "chat", "pic": "image"}


@pytest.fixture(scope="module")
def demo() -> Iterator[dict[str, SpaceProcess]]:
    """The demo's apps, the echo app with a second replica; echo runs 2 at once."""
    started = [SpaceProcess(name, kind=kind, wait=False, concurrency_limit=2)
               for name, kind in KINDS.items()]  # fmt: skip
    try:
        for space in started:
            space.wait_ready(180)
        yield {space.name: space for space in started}
    finally:
        for space in started:
            space.stop()


@pytest.fixture(scope="module")
def services(
    start_service: ServiceFactory, demo: dict[str, SpaceProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[ServiceProcess, ServiceProcess]:  # fmt: skip
    """Two service processes over one SQLite coordinator file."""
    store = tmp_path_factory.mktemp("pins") / "coordinator.db"
    env = {"POOL_SPACES": spaces_env(demo), "POOL_COORDINATOR_URL": f"sqlite:///{store}",
           "POOL_MIN_CONNECTIONS": "2", "POOL_WINDOW_INITIAL": "2",
           "POOL_WINDOW_GROW_AFTER": "1000", "POOL_CONSUMER_MAX_CONCURRENT": "8",
           "POOL_QUEUE_TIMEOUT_S": "60"}  # fmt: skip
    return start_service(**env), start_service(**env)


async def call(service: ServiceProcess, body: dict[str, Any]) -> dict[str, Any]:
    async with service.client() as http:
        answer = await http.post("/api/predict", json=body)
    assert answer.status_code == 200, answer.text
    reply: dict[str, Any] = answer.json()
    return reply


async def test_each_user_keeps_one_replica_across_two_processes(
    services: tuple[ServiceProcess, ServiceProcess], demo: dict[str, SpaceProcess]
) -> None:
    """5 users x 8 calls at once, alternating between the two processes: each user's
    calls ran on one Space only, as the Spaces recorded them (the files stand-in has an
    identical /echo: the calls are spread over the three that have it)."""
    replicas = [demo["alpha"], demo["alpha2"], demo["pic"]]
    await asyncio.gather(*(call(s, {"api_name": "/echo", "args": ["warm", 0], "space": r.name})
                           for s in services for r in replicas))  # fmt: skip
    for space in replicas:
        space.reset()
    calls = [call(services[(u + c) % 2], {"api_name": "/echo", "args": [f"u{u}:{c}", 0.3],
                                          "email": f"crowd{u}@example.com"})
             for c in range(8) for u in range(5)]  # fmt: skip
    await asyncio.gather(*calls)
    served: dict[str, set[str]] = {}
    for space in replicas:
        for _, _, text in space.calls():
            served.setdefault(text.partition(":")[0], set()).add(space.name)
    print(f"\nusers' replicas (the Spaces' records): {served}")
    assert sum(len(space.calls()) for space in replicas) == 40
    assert len(served) == 5 and all(len(where) == 1 for where in served.values()), served


async def test_sessions_without_a_space_continue_on_the_chat_app(
    services: tuple[ServiceProcess, ServiceProcess],
) -> None:
    """6 sessions opened without a Space (3 with an email, 3 anonymous), first call
    /chat: unpinned until then (space null), then every one continues its conversation
    on the chat app, the turns alternating between the two processes."""
    emails = ["s0@example.com", "s1@example.com", "s2@example.com", None, None, None]
    async with services[0].client() as http:
        opened = [await http.post("/api/sessions", json={} if e is None else {"email": e})
                  for e in emails]  # fmt: skip
    assert all(r.status_code == 201 and r.json()["space"] is None for r in opened), [
        r.text for r in opened
    ]
    ids = [r.json()["session"] for r in opened]

    def body(i: int, text: str) -> dict[str, Any]:
        extra = {} if emails[i] is None else {"email": emails[i]}
        return {"api_name": "/chat", "args": [text], "session": ids[i], **extra}

    first = await asyncio.gather(*(call(services[i % 2], body(i, f"hi{i}")) for i in range(6)))
    again = await asyncio.gather(*(call(services[1 - i % 2], body(i, f"on{i}")) for i in range(6)))
    assert all(a["space"] == "chat" for a in first + again)
    assert [a["result"].endswith(f"earlier: hi{i}") for i, a in enumerate(again)] == [True] * 6
    async with services[1].client() as http:
        seen = await http.get(f"/api/sessions/{ids[0]}", params={"email": emails[0]})
    assert seen.json()["space"] == "chat", "pinned by its first call"


async def test_a_session_bound_to_an_app_refuses_another_apps_endpoint(
    services: tuple[ServiceProcess, ServiceProcess],
) -> None:
    """POST /api/sessions {"api_name": "/chat"}: a call of /echo in it is a 422
    unknown_api_name naming the chat app and its endpoints; /chat then works."""
    async with services[0].client() as http:
        opened = await http.post("/api/sessions", json={"api_name": "chat"})
        assert opened.status_code == 201 and opened.json()["space"] is None, opened.text
        session = opened.json()["session"]
        wrong = await http.post("/api/predict", json={"api_name": "/echo", "args": ["x", 0],
                                                      "session": session})  # fmt: skip
        unknown = await http.post("/api/sessions", json={"api_name": "/nowhere"})
    assert wrong.status_code == 422, wrong.text
    assert wrong.json()["error"] == "unknown_api_name" and "'chat'" in wrong.json()["message"]
    assert "/chat" in wrong.json()["message"]
    assert unknown.status_code == 422 and unknown.json()["error"] == "unknown_api_name"
    right = await call(services[1], {"api_name": "/chat", "args": ["ok"], "session": session})
    assert right["space"] == "chat"


async def test_library_sessions_without_a_space_continue_on_the_chat_app(
    demo: dict[str, SpaceProcess],
) -> None:
    """The README's library example: open_session(email) without a Space, then /chat, 6
    of 6 continue their conversation; open_session(api_name=) binds the app."""
    pool = Pool(PoolSettings(spaces=spaces_env(demo), coordinator_url="memory://",
                             min_connections=1))  # fmt: skip
    try:
        sessions = [await pool.open_session(f"lib{i}@example.com" if i < 3 else None)
                    for i in range(6)]  # fmt: skip
        assert all(s.space == "" for s in sessions)
        for turn in ("one", "two"):
            done = await asyncio.gather(*(
                pool.predict("/chat", f"{turn}{i}", session=s,
                             email=f"lib{i}@example.com" if i < 3 else None)
                for i, s in enumerate(sessions)))  # fmt: skip
        assert [d.result.endswith(f"earlier: one{i}") for i, d in enumerate(done)] == [True] * 6
        bound = await pool.open_session(None, api_name="/chat")
        with pytest.raises(UnknownEndpoint, match="'chat'"):
            await pool.predict("/echo", "x", 0, session=bound)
    finally:
        await pool.aclose()


async def test_the_pools_front_scope_over_different_apps_names_each_apps_url(
    services: tuple[ServiceProcess, ServiceProcess],
) -> None:
    """/gradio/ over three apps answers 409 several_apps listing each app with its
    /gradio/{alias}/ URLs (not the first Space's config); /gradio/alpha/ serves alpha."""
    async with services[0].client() as http:
        pooled = await http.get("/gradio/config")
        joined = await http.post("/gradio/gradio_api/queue/join", json={
            "data": ["x", 0], "fn_index": 0, "session_hash": "abcdefgh12345678"})  # fmt: skip
        alias = await http.get("/gradio/alpha/config")
    assert pooled.status_code == 409, pooled.text
    body = pooled.json()
    assert body["error"] == "several_apps" and "/gradio/chat/" in body["detail"]
    assert {a["app"]: a["urls"] for a in body["apps"]} == {
        "alpha": ["/gradio/alpha/", "/gradio/alpha2/"], "chat": ["/gradio/chat/"],
        "pic": ["/gradio/pic/"],
    }  # fmt: skip
    assert joined.status_code == 409 and joined.json()["error"] == "several_apps"
    assert alias.status_code == 200 and alias.json()["root"].endswith("/gradio/alpha")
