"""Streaming over HTTP against real Gradio generator and chat Spaces: a job's SSE stream
and ``POST /api/predict`` with ``stream: true`` deliver each partial within 200 ms of
the Space yielding it, errors keep the app's message, a disconnect frees the slot,
jobs mirrored across workers show partials, and gr.State never crosses users."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.api._streaming import LatestEvents
from app.core._settings import ServiceSettings
from app.jobs import JobRecord, MemoryJobStore
from app.main import create_app
from devspaces import SpaceProcess
from pool import Partial, Pool, PoolSettings, set_pool
from tests.conftest import spaces_env

from .conftest import ServiceProcess, admin_headers, eventually, service_env

Event = tuple[str, dict[str, Any], float]  # (event name, data, time.time() it arrived)


@pytest.fixture(scope="module")
def stream_service(
    stream_spaces: dict[str, SpaceProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """The service over the streamer and chat stand-ins, one connection per Space."""
    directory = tmp_path_factory.mktemp("stream-service")
    env = service_env(
        spaces_env(stream_spaces), directory, POOL_MIN_CONNECTIONS="1", POOL_MAX_CONNECTIONS="1"
    )
    service = ServiceProcess(env, directory / "service.log")
    yield service
    service.stop()


@pytest.fixture
def streamer(stream_spaces: dict[str, SpaceProcess]) -> SpaceProcess:
    space = stream_spaces["streamer"]
    space.control(mode="ok")
    space.reset()
    return space


async def read_sse(response: httpx.Response) -> AsyncIterator[Event]:
    """The events of an SSE response as they arrive (name "message" when unnamed)."""
    name = "message"
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            yield name, json.loads(line[6:]), time.time()
            name = "message"


async def collect(response: httpx.Response) -> list[Event]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    async with asyncio.timeout(60):
        return [event async for event in read_sse(response)]


def check_partials(events: list[Event], count: int) -> list[dict[str, Any]]:
    """The partial events: indexes 0..count-1 in order, all before the final event."""
    partials = [data for _, data, _ in events if "partial" in data]
    assert [p["partial_index"] for p in partials] == list(range(count)), events
    for data in partials:
        assert data["stage"] == "running" and data["partial"]["index"] == data["partial_index"]
    last = max(i for i, (_, data, _) in enumerate(events) if "partial" in data)
    assert last < len(events) - 1 and events[-1][1]["stage"] in ("done", "failed")
    return partials


def late_partials(events: list[Event]) -> list[str]:
    """Partials that arrived 200 ms or more after the Space yielded them (its clock)."""
    lags = [(d["partial_index"], arrived - d["partial"]["t"]) for _, d, arrived in events
            if "partial" in d]  # fmt: skip
    assert all(lag >= 0 for _, lag in lags), lags
    return [f"#{index}: {lag * 1000:.0f} ms" for index, lag in lags if lag >= 0.2]


async def timely(run: Callable[[], Awaitable[list[Event]]], count: int) -> list[Event]:
    """Run a measured stream; on a loaded 2-core machine one scheduler stall can delay a
    partial, so the 200 ms bound must hold for every partial of one of two runs."""
    late: list[str] = []
    for _ in range(2):
        events = await run()
        check_partials(events, count)
        late = late_partials(events)
        if not late:
            return events
    pytest.fail(f"partials later than 200 ms after the Space's yield in two runs: {late}")


async def test_job_events_deliver_each_partial_within_200ms_then_the_result(
    stream_service: ServiceProcess, streamer: SpaceProcess
) -> None:
    """Acceptance: a streaming job's SSE stream gives 4 partials in order, each within
    200 ms of the Space yielding it (300 ms apart), then done with the last as result."""
    async with stream_service.client() as client:

        async def run() -> list[Event]:
            created = await client.post(
                "/api/jobs",
                json={"api_name": "/stream", "args": ["j", 4, 0.3], "space": "streamer"},
            )
            assert created.status_code == 202
            job_id = created.json()["job_id"]
            async with client.stream("GET", f"/api/jobs/{job_id}/events") as response:
                return await collect(response)

        events = await timely(run, 4)
        partials = check_partials(events, 4)
        final = events[-1][1]
        assert final["stage"] == "done" and final["result"] == partials[-1]["partial"]
        assert final["partial_index"] == 3 and "partial" not in final
        versions = [data["version"] for _, data, _ in events]
        assert versions == sorted(versions)


async def test_get_job_shows_the_latest_partial_while_running(
    stream_service: ServiceProcess, streamer: SpaceProcess
) -> None:
    """GET /api/jobs/{id} of a running stream carries partial and partial_index; DELETE
    stops the Space's generator."""
    async with stream_service.client() as client:
        created = await client.post(
            "/api/jobs", json={"api_name": "/stream", "args": ["g", 20, 0.1], "space": "streamer"}
        )
        job_id = created.json()["job_id"]
        seen: dict[str, Any] = {}

        async def has_partial() -> bool:
            body: dict[str, Any] = (await client.get(f"/api/jobs/{job_id}")).json()
            seen.update(body)
            return "partial_index" in body

        await eventually(has_partial, 15, "a partial in GET")
        assert seen["stage"] == "running"
        assert seen["partial"]["index"] == seen["partial_index"]
        assert seen["partial"]["text"].startswith("g0")
        cancelled = await client.delete(f"/api/jobs/{job_id}")
        assert cancelled.json()["stage"] == "cancelled"
        assert cancelled.json()["partial_index"] >= seen["partial_index"]

        async def stopped() -> bool:
            return await asyncio.to_thread(lambda: streamer.stats().in_flight) == 0

        await eventually(stopped, 10, "the Space's generator stopped")


async def test_predict_stream_true_streams_partials_then_the_result(
    stream_service: ServiceProcess, streamer: SpaceProcess
) -> None:
    """POST /api/predict {"stream": true}: admitted, 4 timely partials, then done."""
    body = {"api_name": "/stream", "args": ["s", 4, 0.3], "space": "streamer", "stream": True}
    async with stream_service.client() as client:

        async def run() -> list[Event]:
            async with client.stream("POST", "/api/predict", json=body) as response:
                return await collect(response)

        events = await timely(run, 4)
    assert events[0][1] == {"stage": "running", "space": "streamer"}
    partials = check_partials(events, 4)
    name, final, _ = events[-1]
    assert name == "message" and final["stage"] == "done" and final["attempts"] == 1
    assert final["result"] == partials[-1]["partial"] and final["space"] == "streamer"
    assert {"queued_ms", "duration_ms"} <= set(final)


async def test_accept_event_stream_header_streams_and_plain_endpoints_give_one_result(
    stream_service: ServiceProcess, streamer: SpaceProcess
) -> None:
    """Accept: text/event-stream streams without the body flag; a non-generator
    endpoint streamed gives the admitted event and one done event, no partial."""
    headers = {"Accept": "text/event-stream"}
    async with stream_service.client() as client:
        body = {"api_name": "/stream", "args": ["h", 3, 0.05], "space": "streamer"}
        async with client.stream("POST", "/api/predict", json=body, headers=headers) as response:
            events = await collect(response)
        assert [d.get("partial_index") for _, d, _ in events] == [None, 0, 1, 2, None]
        plain = {"api_name": "/echo", "args": ["p", 0], "space": "streamer", "stream": True}
        async with client.stream("POST", "/api/predict", json=plain) as response:
            events = await collect(response)
        assert [d["stage"] for _, d, _ in events] == ["running", "done"]
        assert events[-1][1]["result"] == "streamer:p"
        without = await client.post("/api/predict", json={**plain, "stream": False})
        assert without.status_code == 200 and without.json()["result"] == "streamer:p"


async def test_stream_errors_carry_the_http_error_json_and_the_apps_message(
    stream_service: ServiceProcess, streamer: SpaceProcess
) -> None:
    """gr.Error after 2 partials: an error event {status: 502, error: upstream, message:
    the app's}; an error before admission is the plain HTTP error (422)."""
    body = {"api_name": "/stream_fail", "args": ["x", 2, 0.05], "space": "streamer", "stream": True}
    async with stream_service.client() as client:
        async with client.stream("POST", "/api/predict", json=body) as response:
            events = await collect(response)
        check_partials(events, 2)
        name, error, _ = events[-1]
        assert name == "error" and error["stage"] == "failed"
        assert error["status"] == 502 and error["error"] == "upstream"
        assert error["message"] == "stream failed: x" and error["request_id"]
        unknown = await client.post(
            "/api/predict", json={**body, "space": "nope"}, headers={"Accept": "text/event-stream"}
        )
        assert unknown.status_code == 422 and unknown.json()["error"] == "unknown_space"
        job = await client.post("/api/jobs", json={**body, "stream": False})
        async with client.stream("GET", f"/api/jobs/{job.json()['job_id']}/events") as response:
            events = await collect(response)
        failed = events[-1][1]
        assert failed["stage"] == "failed" and failed["partial_index"] == 1
        assert failed["error"]["status"] == 502
        assert failed["error"]["message"] == "stream failed: x"


async def test_gr_error_is_502_with_the_apps_message_only(
    stream_service: ServiceProcess,
) -> None:
    """gr.Error("failed: boom") in the chat Space: 502 whose message is exactly the app's."""
    async with stream_service.client() as client:
        response = await client.post(
            "/api/predict", json={"api_name": "/fail", "args": ["boom"], "space": "chat"}
        )
    assert response.status_code == 502
    assert response.json()["message"] == "failed: boom"
    assert "Traceback" not in response.text and 'File "' not in response.text


async def test_disconnecting_stream_client_cancels_upstream_and_frees_the_slot(
    stream_service: ServiceProcess, streamer: SpaceProcess
) -> None:
    """The caller of a 10 s direct stream leaves after the first partial: the Space's
    generator stops and the service holds no slot."""
    body = {"api_name": "/stream", "args": ["d", 50, 0.2], "space": "streamer", "stream": True}
    async with stream_service.client() as client:
        async with client.stream("POST", "/api/predict", json=body) as response:
            async with asyncio.timeout(20):
                async for _, data, _ in read_sse(response):
                    if "partial" in data:
                        assert await asyncio.to_thread(lambda: streamer.stats().in_flight) == 1
                        break

        async def freed() -> bool:
            stats = (await client.get("/api/admin/pool-stats", headers=admin_headers())).json()
            in_flight = await asyncio.to_thread(lambda: streamer.stats().in_flight)
            return bool(in_flight == 0 and stats["admission"]["globalInUse"] == 0)

        await eventually(freed, 10, "the stream cancelled upstream and its slot freed")


async def test_stream_caller_gone_while_queued_is_cancelled_once_admitted(
    stream_service: ServiceProcess, streamer: SpaceProcess
) -> None:
    """A stream:true caller queued behind another (one connection) disconnects: once the
    blocker ends, its call is admitted and cancelled at once, not run for 10 s."""
    blocker = {"api_name": "/stream", "args": ["b", 50, 0.2], "space": "streamer", "stream": True}
    queued = {**blocker, "args": ["q", 50, 0.2]}
    async with stream_service.client() as client, stream_service.client() as other:
        async with client.stream("POST", "/api/predict", json=blocker) as response:
            reader = read_sse(response)  # kept open: the blocker streams on meanwhile
            async with asyncio.timeout(20):
                while "partial" not in (await anext(reader))[1]:
                    pass
            waiter = asyncio.create_task(other.post("/api/predict", json=queued))

            async def is_queued() -> bool:
                stats = (await client.get("/api/admin/pool-stats", headers=admin_headers())).json()
                waiting = stats["totalQueued"] + stats["pools"]["streamer"]["localWaiters"]
                return bool(waiting >= 1)  # for a slot, or for the one connection

            await eventually(is_queued, 10, "the second stream queued")
            waiter.cancel()  # the queued caller gives up and closes its connection
            with pytest.raises(asyncio.CancelledError):
                await waiter
            await reader.aclose()
        seen: dict[str, Any] = {}

        async def freed() -> bool:
            stats = (await client.get("/api/admin/pool-stats", headers=admin_headers())).json()
            space = await asyncio.to_thread(streamer.stats)
            seen.update(
                space_in_flight=space.in_flight, space_total=space.total,
                global_in_use=stats["admission"]["globalInUse"], queued=stats["totalQueued"],
                waiters=stats["pools"]["streamer"]["localWaiters"],
            )  # fmt: skip
            return not (seen["space_in_flight"] or seen["global_in_use"] or seen["queued"]
                        or seen["waiters"])  # fmt: skip

        deadline = time.monotonic() + 8
        while not await freed():
            assert time.monotonic() < deadline, f"not freed within 8 s: {seen}"
            await asyncio.sleep(0.05)
        calls = await asyncio.to_thread(streamer.intervals)
        assert len(calls) <= 2 and all(end - start < 5 for start, end in calls), calls


async def test_chat_state_is_not_shared_between_users_over_http(
    stream_service: ServiceProcess, stream_spaces: dict[str, SpaceProcess]
) -> None:
    """With one connection to the chat Space, B's request right after A's (same Client,
    no new one opened) sees no history of A's, streamed or not."""
    chat = stream_spaces["chat"]
    async with stream_service.client() as client:

        async def turn(email: str, message: str, stream: bool = False) -> str:
            body = {"api_name": "/chat", "args": [message], "space": "chat", "email": email}
            if not stream:
                response = await client.post("/api/predict", json=body)
                assert response.status_code == 200, response.text
                return str(response.json()["result"])
            async with client.stream("POST", "/api/predict", json={**body, "stream": True}) as r:
                events = await collect(r)
            assert len([d for _, d, _ in events if "partial" in d]) >= 3
            return str(events[-1][1]["result"])

        await turn("warm@example.com", "warm-up")
        chat.reset()
        assert "earlier: (nothing)" in await turn("a@example.com", "secret-of-a")
        reply = await turn("b@example.com", "hello", stream=True)
        assert "earlier: (nothing)" in reply and "secret" not in reply
        reply = await turn("a@example.com", "again")
        assert "hello" not in reply and "secret" not in reply
        assert chat.stats().config_requests == 0, "one connection, reused"


@pytest.fixture
async def two_workers(
    stream_spaces: dict[str, SpaceProcess], tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Two app instances (two workers' job runners) over one SQLite coordinator."""
    url = f"sqlite:///{tmp_path / 'shared' / 'coordinator.db'}"
    set_pool(Pool(PoolSettings(spaces=spaces_env(stream_spaces), coordinator_url=url)))
    apps: list[FastAPI] = [create_app(ServiceSettings()) for _ in range(2)]
    try:
        async with (
            apps[0].router.lifespan_context(apps[0]),
            apps[1].router.lifespan_context(apps[1]),
        ):
            clients = [
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://w", timeout=30
                )
                for app in apps
            ]
            yield clients[0], clients[1]
            for client in clients:
                await client.aclose()
    finally:
        set_pool(None)


async def test_partials_of_a_job_are_readable_on_another_worker(
    two_workers: tuple[httpx.AsyncClient, httpx.AsyncClient], streamer: SpaceProcess
) -> None:
    """A stream running on worker A: worker B's GET shows a partial while it runs, and
    B's SSE stream shows partials, then done with the full result."""
    a, b = two_workers
    body = {"api_name": "/stream", "args": ["m", 8, 0.15], "space": "streamer"}
    job_id = (await a.post("/api/jobs", json=body)).json()["job_id"]
    seen: dict[str, Any] = {}

    async def partial_on_b() -> bool:
        seen.update((await b.get(f"/api/jobs/{job_id}")).json())
        return "partial_index" in seen and seen["stage"] == "running"

    await eventually(partial_on_b, 15, "a partial visible on worker B")
    assert seen["partial"]["text"].startswith("m0")
    response = await b.get(f"/api/jobs/{job_id}/events")
    lines = response.text.splitlines()
    views = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert any("partial" in view for view in views)
    assert views[-1]["stage"] == "done" and views[-1]["result"]["text"].endswith("m7")


def test_slow_reader_buffer_keeps_the_latest_partials_and_the_final() -> None:
    """LatestEvents(keep=3): 10 partials unread, then the result: the reader gets
    partials 7, 8, 9 and the final."""
    events = LatestEvents(keep=3)
    events.admit("streamer")
    for i in range(10):
        events.partial("streamer", Partial(i, f"t{i}"))
    events.finish({"stage": "done", "result": "t9"})
    admitted, partials = events.take()
    assert admitted == ["streamer"] and [p.index for _, p in partials] == [7, 8, 9]
    assert events.final == {"stage": "done", "result": "t9"} and events.dropped == 7


async def test_job_store_keeps_the_latest_views_for_a_slow_reader() -> None:
    """history=4: after 20 partial updates and done, a reader at version 1 gets the last
    4 views, the final among them."""
    store = MemoryJobStore(retention_s=60, max_jobs=5, history=4)
    await store.add(JobRecord("j", "queued", created_at=time.time(), updated_at=time.time()))
    await store.update("j", stage="running")
    for i in range(20):
        await store.update("j", partial=f"p{i}", partial_index=i)
    await store.update("j", stage="done", result="p19")
    views = await store.changes("j", 1, timeout=0)
    assert views is not None and len(views) == 4
    assert [v.get("partial_index") for v in views] == [17, 18, 19, 19]
    assert views[-1]["stage"] == "done" and views[-1]["result"] == "p19"
