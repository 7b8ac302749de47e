"""Sessions over HTTP, against a real gr.ChatInterface (history in gr.State): a
conversation keeps its history across turns served by two worker processes sharing one
SQLite coordinator, sessions stay apart, nothing is held between turns, and a deleted,
or restarted session answers 404 / 410 (expiry: tests/pool/test_sessions.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from devspaces import SpaceProcess

from .conftest import ServiceFactory, ServiceProcess, admin_headers

IDLE_S = 120.0  # expiry itself: tests/pool/test_sessions.py (same SQLite store code)


@pytest.fixture(scope="module")
def services(
    start_service: ServiceFactory, talk: SpaceProcess, tmp_path_factory: pytest.TempPathFactory
) -> tuple[ServiceProcess, ServiceProcess]:
    """Two service processes over one SQLite coordinator file: two workers of a fleet."""
    store = tmp_path_factory.mktemp("shared") / "coordinator.db"
    env = {"POOL_SPACES": f"talk={talk.url}", "POOL_COORDINATOR_URL": f"sqlite:///{store}",
           "POOL_SESSION_IDLE_S": str(IDLE_S), "POOL_MIN_CONNECTIONS": "1"}  # fmt: skip
    return start_service(**env), start_service(**env)


async def turn(service: ServiceProcess, session: str, message: str, **extra: Any) -> str:
    async with service.client() as http:
        body = {"api_name": "/chat", "args": [message], "session": session, **extra}
        response = await http.post("/api/predict", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["space"] == "talk"
    reply: str = response.json()["result"]
    return reply


async def job_turn(service: ServiceProcess, session: str, message: str) -> str:
    async with service.client() as http:
        body = {"api_name": "/chat", "args": [message], "session": session}
        created = await http.post("/api/jobs", json=body)
        assert created.status_code == 202, created.text
        url = created.json()["url"]
        for _ in range(300):
            view = (await http.get(url)).json()
            if view["stage"] in ("done", "failed", "cancelled"):
                assert view["stage"] == "done", view
                reply: str = view["result"]
                return reply
            await asyncio.sleep(0.05)
    raise AssertionError("the job did not finish")


async def nothing_in_use(service: ServiceProcess) -> None:
    """Between turns the session holds no connection and no slot. A job is "done" as
    soon as its result is kept, its connection goes back a moment later: asked again for
    up to 3 s (a loaded run saw one still in use at the first look)."""
    async with service.client(**admin_headers()) as http:
        for _ in range(60):
            stats = (await http.get("/api/admin/pool-stats")).json()
            if stats["inUseConnections"] == 0 and stats["admission"]["globalInUse"] == 0:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"still in use between turns: {stats}")


async def test_two_interleaved_conversations_across_two_workers(
    services: tuple[ServiceProcess, ServiceProcess],
) -> None:
    """Sessions opened on worker A, turns alternating A/B (the third as a job): each
    reply names only its own session's earlier messages; nothing in use between turns."""
    a, b = services
    async with a.client() as http:
        opened = [await http.post("/api/sessions", json=body)
                  for body in ({"email": "ann@example.com"}, {})]  # fmt: skip
    assert all(r.status_code == 201 for r in opened), [r.text for r in opened]
    ann, anon = (r.json()["session"] for r in opened)
    assert {r.json()["space"] for r in opened} == {None}, "unpinned until the first call"
    assert all(r.json()["expires_at"].endswith("Z") for r in opened)
    ann_says = {"email": "ann@example.com"}
    assert (await turn(a, ann, "a1", **ann_says)).endswith("earlier: (nothing)")
    assert (await turn(b, anon, "n1")).endswith("earlier: (nothing)")
    await nothing_in_use(a)
    await nothing_in_use(b)
    assert (await turn(b, ann, "a2", **ann_says)).endswith("earlier: a1")
    assert (await turn(a, anon, "n2")).endswith("earlier: n1")
    await nothing_in_use(a)
    await nothing_in_use(b)
    assert (await job_turn(a, anon, "n3")).endswith("earlier: n1 | n2")
    assert (await turn(a, ann, "a3", **ann_says)).endswith("earlier: a1 | a2")
    async with b.client() as http:
        seen = await http.get(f"/api/sessions/{ann}", params={"email": "ann@example.com"})
        assert seen.status_code == 200 and seen.json()["session"] == ann
        assert seen.json()["space"] == "talk", "pinned by its first call"
        theirs = await http.get(f"/api/sessions/{ann}")  # without the owner's email
        assert theirs.status_code == 404 and theirs.json()["error"] == "session_not_found"


async def test_deleted_and_unknown_sessions_answer_404(
    services: tuple[ServiceProcess, ServiceProcess],
) -> None:
    """DELETE ends a session: its next call, on the other worker, is 404; so is a second
    DELETE and an id never issued."""
    a, b = services
    async with a.client() as http:
        gone = (await http.post("/api/sessions", json={})).json()["session"]
        assert (await http.delete(f"/api/sessions/{gone}")).status_code == 204
    async with b.client() as http:
        body = {"api_name": "/chat", "args": ["x"], "session": gone}
        answer = await http.post("/api/predict", json=body)
        assert answer.status_code == 404 and answer.json()["error"] == "session_not_found"
        assert (await http.delete(f"/api/sessions/{gone}")).status_code == 404
        assert (await http.get(f"/api/sessions/{'x' * 32}")).status_code == 404


async def test_a_restarted_space_answers_410_session_lost(
    services: tuple[ServiceProcess, ServiceProcess], talk: SpaceProcess
) -> None:
    """The session's Space restarts (new app_id): the next turn is 410 session_lost,
    never a fresh history; then the session is gone (404) and a new one works."""
    a, b = services
    async with a.client() as http:
        session = (await http.post("/api/sessions", json={})).json()["session"]
    await turn(a, session, "before")
    await asyncio.to_thread(talk.restart)
    async with b.client() as http:
        body = {"api_name": "/chat", "args": ["after"], "session": session}
        lost = await http.post("/api/predict", json=body)
        assert lost.status_code == 410 and lost.json()["error"] == "session_lost", lost.text
        assert (await http.post("/api/predict", json=body)).status_code == 404
        fresh = (await http.post("/api/sessions", json={})).json()["session"]
    assert (await turn(b, fresh, "new")).endswith("earlier: (nothing)")
