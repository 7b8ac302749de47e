"""Resilience as an HTTP caller sees it: deadlines, the secret guard, waking jobs."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from devspaces import SpaceFleet, SpaceProcess, free_port
from pool import Pool, PoolSettings, set_pool
from pool.resilience import FakeSpaceControl
from tests._vclock import VirtualClock
from tests.pool.test_resilience import boot_on_wake
from tests.service.conftest import ServiceFactory, admin_headers, eventually, wait_for

PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"
    "-----END OPENSSH PRIVATE KEY-----"
)
BEARER_VALUE = "sk-test-9f8e7d6c5b4a39281706"


async def test_deadline_is_a_504_near_the_deadline_and_frees_the_slot(
    spaces: SpaceFleet, start_service: ServiceFactory
) -> None:
    """A 4 s deadline on a 60 s predict: 504 near 4 s, the upstream job cancelled,
    the slot free at once."""
    service = start_service()
    alpha = spaces["alpha"]
    async with service.client() as http:
        began = time.monotonic()
        response = await http.post(
            "/api/predict",
            json={"api_name": "/echo", "args": ["long", 60], "space": "alpha", "timeout_s": 4},
        )
        took = time.monotonic() - began
        assert response.status_code == 504, response.text
        assert response.json()["error"] == "deadline"
        assert 3.5 <= took <= 6.5, took
        stats = (await http.get("/api/admin/pool-stats", headers=admin_headers())).json()
        assert stats["admission"]["globalInUse"] == 0
        assert stats["pools"]["alpha"]["inUseConnections"] == 0
    wait_for(lambda: alpha.stats().in_flight == 0, 3, "the upstream job cancelled")


async def test_guard_refuses_secrets_with_a_reason_and_no_trace(
    spaces: SpaceFleet, start_service: ServiceFactory
) -> None:
    """A PEM key or a bearer header is refused with 422 and a reason code; the Space
    never sees it, the window does not move, and the secret is in no log or answer."""
    service = start_service(POOL_SECRET_GUARD="on")
    async with service.client() as http:
        before = (await http.get("/api/admin/pool-stats", headers=admin_headers())).json()
        for payload, reason in (
            ([PEM], "private_key"),
            ([f"Authorization: Bearer {BEARER_VALUE}", 0], "bearer_token"),
        ):
            for _ in range(4):
                response = await http.post(
                    "/api/predict",
                    json={"api_name": "/echo", "args": payload, "space": "alpha"},
                )
                assert response.status_code == 422, response.text
                body = response.json()
                assert (body["error"], body["reason"]) == ("refused", reason)
                assert BEARER_VALUE not in response.text and "PRIVATE KEY" not in response.text
        after = (await http.get("/api/admin/pool-stats", headers=admin_headers())).json()
        metrics = (await http.get("/metrics")).text
    assert spaces["alpha"].stats().total == 0
    window = after["pools"]["alpha"]["window"]
    assert window["current"] == before["pools"]["alpha"]["window"]["current"]
    assert after["pools"]["alpha"]["breaker"]["consecutiveFailures"] == 0
    assert 'spacepool_policy_refusals_total{reason="private_key",space="alpha"} 4.0' in metrics
    log = service.log_text()
    assert BEARER_VALUE not in log and "PRIVATE KEY" not in log and "b3BlbnNza" not in log


async def test_job_on_a_sleeping_space_shows_waking_then_runs(spaces: SpaceFleet) -> None:
    """A job for a sleeping Space reports stage ``waking`` (naming the Space) while it
    boots (4 s on a virtual clock, then the real boot), then ``running`` and ``done`` on
    that Space."""
    from app.main import create_app

    clock = VirtualClock()
    port = free_port()
    booted: list[SpaceProcess] = []
    boots: list[asyncio.Task[None]] = []
    control = FakeSpaceControl(
        {"sleepy": "SLEEPING"}, on_wake=boot_on_wake("sleepy", port, 4.0, clock, booted, boots)
    )
    settings = PoolSettings(
        spaces=f"sleepy=http://127.0.0.1:{port}/,{spaces.pool_spaces_env()}",
        coordinator_url="memory://",
        wake_timeout_s=60,
        wake_poll_s=0.25,
        min_connections=1,
    )
    set_pool(Pool(settings, space_control=control, clock=clock))
    app = create_app()
    stages: list[dict[str, Any]] = []
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://svc") as http:
                created = await http.post(
                    "/api/jobs", json={"api_name": "/echo", "args": ["hi", 0], "space": "sleepy"}
                )
                assert created.status_code == 202, created.text
                url = created.json()["url"]

                async def finished() -> bool:
                    view = (await http.get(url)).json()
                    if not stages or stages[-1]["stage"] != view["stage"]:
                        stages.append(view)
                    return view["stage"] in ("done", "failed", "cancelled")

                await eventually(finished, 60, "the job finished", every_s=0.1)
    finally:
        set_pool(None)
        for boot in boots:
            boot.cancel()
        await asyncio.gather(*boots, return_exceptions=True)
        for space in booted:
            space.stop()
        await asyncio.sleep(0)
    seen = [view["stage"] for view in stages]
    assert "waking" in seen and seen[-1] == "done", stages
    assert seen.index("waking") < seen.index("running") if "running" in seen else True
    waking = next(view for view in stages if view["stage"] == "waking")
    assert waking["space"] == "sleepy"
    assert stages[-1]["result"] == "sleepy:hi" and stages[-1]["space"] == "sleepy"


async def test_a_full_space_queue_waits_again_instead_of_failing_at_retry_attempts(
    spaces: SpaceFleet, start_service: ServiceFactory
) -> None:
    """A predict pinned to a Space whose own queue is full is not failed at
    ``POOL_RETRY_ATTEMPTS`` (1 here): it waits in the pool's queue again, and is served
    once the Space has room, within its queue timeout (one rule for both faces)."""
    service = start_service(POOL_RETRY_ATTEMPTS="1", POOL_QUEUE_TIMEOUT_S="20",
                            POOL_BREAKER_FAILURES="50")  # fmt: skip
    alpha = spaces["alpha"]
    alpha.control(mode="queue_full")

    async def room_after_two_refusals() -> None:
        while alpha.stats().refused < 2:
            await asyncio.sleep(0.05)
        alpha.control(mode="ok")

    room = asyncio.create_task(room_after_two_refusals())
    try:
        async with service.client() as http:
            response = await http.post(
                "/api/predict", json={"api_name": "/echo", "args": ["full", 0], "space": "alpha"}
            )
    finally:
        room.cancel()
        alpha.control(mode="ok")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["result"] == "alpha:full" and body["attempts"] >= 3, body
    assert alpha.stats().refused >= 2
