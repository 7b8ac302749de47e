"""POST /api/predict on a real uvicorn process over real stand-in Spaces: results, the
global cap as the Spaces measure it, busy answers, and every error status a caller can
provoke (never a 500)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from devspaces import SpaceFleet

from .conftest import ServiceFactory, ServiceProcess, coordinator_url, eventually

API_TOKEN = "api-token-for-tests-91c2"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
GLOBAL_CAP = 4


@pytest.fixture(scope="module")
def service(start_service: ServiceFactory) -> ServiceProcess:
    """Global cap 4, two per user, a generous queue, an API token."""
    return start_service(
        POOL_GLOBAL_MAX_CONCURRENT=str(GLOBAL_CAP),
        POOL_CONSUMER_MAX_CONCURRENT="2",
        POOL_QUEUE_TIMEOUT_S="30",
        POOL_API_TOKEN=API_TOKEN,
    )


@pytest.fixture(scope="module")
def tight(start_service: ServiceFactory) -> ServiceProcess:
    """Global cap 1 and a 1 s queue deadline: the busy path."""
    return start_service(POOL_GLOBAL_MAX_CONCURRENT="1", POOL_QUEUE_TIMEOUT_S="1")


def echo(text: str, delay_s: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {"api_name": "/echo", "args": [text, delay_s], **extra}


async def test_thirty_concurrent_predicts_from_ten_users_all_succeed_under_the_cap(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """30 concurrent predicts from 10 users: all 200 with the echo; Spaces never see > cap
    (counted on the Spaces' own clock: the intervals of the calls they ran)."""
    await asyncio.to_thread(spaces.reset)
    started = time.monotonic()
    async with service.client(**AUTH) as client:
        responses = await asyncio.gather(
            *(
                client.post(
                    "/api/predict",
                    json=echo(f"u{i % 10}-r{i}", 0.4, email=f"user{i % 10}@example.com"),
                )
                for i in range(30)
            )
        )
    elapsed = time.monotonic() - started

    assert [r.status_code for r in responses] == [200] * 30, [r.text for r in responses]
    for i, response in enumerate(responses):
        body = response.json()
        assert body["space"] in ("alpha", "beta")
        assert body["result"] == f"{body['space']}:u{i % 10}-r{i}"
        assert body["queued_ms"] >= 0 and body["duration_ms"] >= 400 * 0.9
    peaks = {s.name: s.stats().peak for s in spaces}
    at_once = await asyncio.to_thread(spaces.concurrent_peak)
    assert at_once <= GLOBAL_CAP, (at_once, peaks)
    assert at_once >= 2, peaks  # the cap was actually exercised
    # 30 × 0.4 s through 4 slots cannot take less than 3 s.
    assert elapsed >= 30 * 0.4 / GLOBAL_CAP * 0.95, elapsed
    print(f"\n30 predicts: {elapsed:.2f} s, Space peaks {peaks}, fleet at once {at_once}")


async def test_busy_answers_503_with_retry_after_and_position_within_the_queue_deadline(
    tight: ServiceProcess, spaces: SpaceFleet
) -> None:
    """Cap 1, queue 1 s, six 3 s predicts: one or two 200, the rest 503 busy in ~1 s."""

    async def timed(client: httpx.AsyncClient, i: int) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        response = await client.post("/api/predict", json=echo(f"busy{i}", 3.0))
        return response, time.monotonic() - started

    async with tight.client() as client:
        results = await asyncio.gather(*(timed(client, i) for i in range(6)))

    codes = sorted(r.status_code for r, _ in results)
    assert 500 not in codes
    assert 1 <= codes.count(200) <= 2 and codes.count(503) == 6 - codes.count(200), codes
    busy_latencies = []
    for response, latency in results:
        if response.status_code != 503:
            continue
        body = response.json()
        assert body["error"] == "busy"
        assert isinstance(body["queue_position"], int) and body["queue_position"] >= 1
        retry_after = response.headers["Retry-After"]
        assert retry_after.isdigit() and int(retry_after) >= 1
        assert body["retry_after_s"] == int(retry_after)
        busy_latencies.append(latency)
    assert max(busy_latencies) < 2.5, busy_latencies  # the 1 s deadline, plus overhead
    assert all(s.stats().peak <= 1 for s in spaces)
    print(f"\nbusy answers after {min(busy_latencies):.2f}–{max(busy_latencies):.2f} s")


async def test_a_batch_priority_request_is_served(service: ServiceProcess) -> None:
    """``priority: "batch"`` in the body (docs/scheduling.md) is admitted and served."""
    async with service.client(**AUTH) as client:
        response = await client.post("/api/predict", json=echo("b", priority="batch"))
    assert response.status_code == 200, response.text
    assert response.json()["result"].endswith(":b")


async def test_unknown_api_name_is_422_naming_the_available_ones(service: ServiceProcess) -> None:
    """An api_name the Space lacks: 422 that lists the Space's endpoints."""
    async with service.client(**AUTH) as client:
        response = await client.post("/api/predict", json={"api_name": "/nope", "args": []})
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "unknown_api_name"
    assert {"/echo", "/state", "/fail"} <= set(body["available"])


async def test_unknown_space_is_422_naming_the_configured_ones(service: ServiceProcess) -> None:
    """A space that is not configured: 422 that lists alpha and beta."""
    async with service.client(**AUTH) as client:
        response = await client.post("/api/predict", json=echo("x", space="gamma"))
    assert response.status_code == 422
    assert response.json()["error"] == "unknown_space"
    assert response.json()["available"] == ["alpha", "beta"]


async def test_app_error_is_502_upstream_without_a_stack_trace(service: ServiceProcess) -> None:
    """The Space's app raised: 502 {error: upstream, kind, message}, no traceback."""
    async with service.client(**AUTH) as client:
        response = await client.post("/api/predict", json={"api_name": "/fail", "args": ["x"]})
    assert response.status_code == 502
    body = response.json()
    assert body["error"] == "upstream" and body["kind"] == "app_error"
    assert "Traceback" not in response.text and 'File "' not in response.text


async def test_deadline_is_504_and_the_upstream_job_is_cancelled(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """timeout_s shorter than the predict: 504 at the deadline; the Space stops the call."""
    async with service.client(**AUTH) as client:
        started = time.monotonic()
        response = await client.post("/api/predict", json=echo("slow", 30.0, timeout_s=1.0))
        elapsed = time.monotonic() - started
    assert response.status_code == 504
    assert response.json()["error"] == "deadline"
    assert elapsed < 5.0

    async def idle() -> bool:
        return await asyncio.to_thread(lambda: all(s.stats().in_flight == 0 for s in spaces))

    await eventually(idle, 10, "the Space's call cancelled")


async def test_api_token_is_required_when_configured(service: ServiceProcess) -> None:
    """POOL_API_TOKEN set: no token or a wrong one is 401 with WWW-Authenticate: Bearer."""
    async with service.client() as client:
        missing = await client.post("/api/predict", json=echo("x"))
        wrong = await client.post(
            "/api/predict", json=echo("x"), headers={"Authorization": "Bearer nope"}
        )
        jobs = await client.get("/api/jobs/whatever")
    for response in (missing, wrong, jobs):
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        assert response.json()["error"] == "unauthorized"
        assert API_TOKEN not in response.text


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"args": ["x", 0]}, "api_name"),
        ({"api_name": "/echo", "args": "not a list"}, "args"),
        ({"api_name": "/echo", "timeout_s": 0}, "timeout_s"),
        ({"api_name": "/echo", "timeout_s": 3601}, "timeout_s"),
        ({"api_name": "/echo", "email": "x" * 300}, "email"),
        ({"api_name": "/echo", "email": "no-at-sign"}, "email"),
        ({"api_name": "/e cho"}, "api_name"),
        ({"api_name": "/echo", "args": list(range(65))}, "args"),
        ({"api_name": "/echo", "kwargs": {"fn_index": 1}}, "kwargs"),
        ({"api_name": "/echo", "kwargs": {"not an identifier": 1}}, "kwargs"),
        ({"api_name": "/echo", "space": "../etc"}, "space"),
        ({"api_name": "/echo", "surprise": 1}, "surprise"),
        ({"api_name": "/echo", "priority": "urgent"}, "priority"),
    ],
)
async def test_invalid_bodies_are_422_with_field_level_messages(
    service: ServiceProcess, body: dict[str, Any], field: str
) -> None:
    """Each malformed body is a 422 whose detail names the offending field."""
    async with service.client(**AUTH) as client:
        response = await client.post("/api/predict", json=body)
    assert response.status_code == 422, response.text
    payload = response.json()
    assert payload["error"] == "invalid_body"
    assert any(field in [str(p) for p in item["loc"]] for item in payload["detail"]), payload
    assert all("input" not in item for item in payload["detail"])


async def test_nested_or_non_finite_payloads_are_422(service: ServiceProcess) -> None:
    """NaN and 40-deep nesting in args are refused before they reach a Space."""
    deep: Any = "x"
    for _ in range(40):
        deep = [deep]
    async with service.client(**AUTH) as client:
        nan = await client.post(
            "/api/predict",
            content=b'{"api_name": "/echo", "args": [NaN, 0]}',
            headers={"Content-Type": "application/json"},
        )
        nested = await client.post("/api/predict", json={"api_name": "/echo", "args": [deep]})
    assert nan.status_code == 422 and "finite" in nan.text
    assert nested.status_code == 422 and "nested" in nested.text


async def test_oversized_body_is_413(service: ServiceProcess) -> None:
    """A body over POOL_MAX_BODY_BYTES (1 MiB) is refused with 413, not read whole."""
    async with service.client(**AUTH) as client:
        response = await client.post("/api/predict", json=echo("x" * 1_100_000))
    assert response.status_code == 413
    assert response.json()["error"] == "too_large"


async def test_unknown_job_is_404(service: ServiceProcess) -> None:
    """GET, DELETE and events of a job that does not exist: 404 job_not_found."""
    async with service.client(**AUTH) as client:
        answers = [
            await client.get("/api/jobs/nope"),
            await client.delete("/api/jobs/nope"),
            await client.get("/api/jobs/nope/events"),
        ]
    for response in answers:
        assert response.status_code == 404
        assert response.json()["error"] == "job_not_found"


async def test_request_id_is_returned_and_reused_when_given(service: ServiceProcess) -> None:
    """X-Request-ID: a safe one sent is echoed; otherwise one is generated."""
    async with service.client() as client:
        given = await client.get("/healthz", headers={"X-Request-ID": "abc-123"})
        made = await client.get("/healthz")
        unsafe = await client.get("/healthz", headers={"X-Request-ID": "a b\tc"})
    assert given.headers["X-Request-ID"] == "abc-123"
    assert len(made.headers["X-Request-ID"]) == 32
    assert unsafe.headers["X-Request-ID"] != "a b\tc"


@pytest.mark.skipif(
    coordinator_url(Path("/tmp")) == "memory://", reason="needs the SQLite coordinator"
)
async def test_two_workers_share_the_global_cap_through_the_sqlite_coordinator(
    start_service: ServiceFactory, spaces: SpaceFleet
) -> None:
    """uvicorn --workers 2 on one SQLite file: both serve at once, Spaces never see > cap 2
    (counted on the Spaces' own clock: the intervals of the calls they ran)."""
    service = start_service(workers=2, POOL_GLOBAL_MAX_CONCURRENT="2", POOL_QUEUE_TIMEOUT_S="30")
    await asyncio.to_thread(spaces.reset)

    def pids_of(tag: str) -> set[int]:
        return {
            line["pid"]
            for line in service.log_lines()
            if str(line.get("request_id", "")).startswith(tag) and line.get("status") == 200
        }

    rounds = 0
    # The kernel hands a burst of connections to whichever worker accepts first:
    # send bursts (one connection per request) until one burst spans both workers.
    for rounds in range(1, 11):
        clients = [service.client(**{"X-Request-ID": f"r{rounds}-{i}"}) for i in range(8)]
        responses = await asyncio.gather(
            *(c.post("/api/predict", json=echo(f"w{i}", 0.3)) for i, c in enumerate(clients))
        )
        for client in clients:
            await client.aclose()
        assert [r.status_code for r in responses] == [200] * 8, [r.text for r in responses]
        if len(pids_of(f"r{rounds}-")) == 2:
            break
    peaks = {s.name: s.stats().peak for s in spaces}
    at_once = await asyncio.to_thread(spaces.concurrent_peak)
    assert len(pids_of(f"r{rounds}-")) == 2, f"no burst reached both workers in {rounds} rounds"
    assert at_once <= 2, (at_once, peaks)
    print(f"\n2 workers after {rounds} burst(s): fleet at once {at_once}, Space peaks {peaks}")
