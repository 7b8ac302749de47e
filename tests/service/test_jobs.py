"""Jobs: followed over SSE through queued → running → done, cancelled by DELETE with the
slot back at once, readable after their stream ends; and the in-process job store's
retention, bound and one-event-per-change history."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import httpx
import pytest

from app.core._errors import JobsFull
from app.jobs import JobRecord, MemoryJobStore
from devspaces import SpaceFleet

from .conftest import ServiceFactory, ServiceProcess, admin_headers, eventually


@pytest.fixture(scope="module")
def tight(start_service: ServiceFactory) -> ServiceProcess:
    """Global cap 1 (so a second job queues), jobs may wait 60 s for admission."""
    return start_service(
        POOL_GLOBAL_MAX_CONCURRENT="1",
        POOL_QUEUE_TIMEOUT_S="1",
        POOL_JOB_QUEUE_TIMEOUT_S="60",
    )


def echo_job(text: str, delay_s: float, **extra: Any) -> dict[str, Any]:
    return {"api_name": "/echo", "args": [text, delay_s], **extra}


async def read_events(
    client: httpx.AsyncClient, job_id: str, last_event_id: int | None = None
) -> list[dict[str, Any]]:
    """Every SSE event of the job until the server ends the stream (bounded)."""
    events: list[dict[str, Any]] = []
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    async with asyncio.timeout(180):
        async with client.stream("GET", f"/api/jobs/{job_id}/events", headers=headers) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            event_id = None
            async for line in response.aiter_lines():
                if line.startswith("id: "):
                    event_id = int(line[4:])
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
                    assert data["version"] == event_id
                    events.append(data)
    return events


async def stage_of(client: httpx.AsyncClient, job_id: str) -> str:
    response = await client.get(f"/api/jobs/{job_id}")
    assert response.status_code == 200
    stage: str = response.json()["stage"]
    return stage


async def follow_queued_job(service: ServiceProcess, delay_s: float) -> None:
    """A job queued behind another: its events go queued → running → done."""
    async with service.client() as client:
        blocker = await client.post("/api/jobs", json=echo_job("blocker", 2.0))
        assert blocker.status_code == 202
        blocker_id = blocker.json()["job_id"]

        async def blocker_running() -> bool:
            return await stage_of(client, blocker_id) == "running"

        await eventually(blocker_running, 15, "blocker running")
        created = await client.post("/api/jobs", json=echo_job("followed", delay_s))
        assert created.status_code == 202
        assert created.headers["Location"] == f"/api/jobs/{created.json()['job_id']}"
        job_id = created.json()["job_id"]
        events = await read_events(client, job_id)

        stages = [e["stage"] for e in events]
        collapsed = [s for i, s in enumerate(stages) if i == 0 or stages[i - 1] != s]
        assert collapsed == ["queued", "running", "done"], stages
        assert [e["version"] for e in events] == sorted({e["version"] for e in events})
        assert any(e.get("queue_position", 0) >= 1 for e in events if e["stage"] == "queued")
        done = events[-1]
        assert done["result"] == f"{done['space']}:followed"
        assert done["duration_ms"] >= delay_s * 1000 * 0.9
        # The stream has ended; the job stays readable.
        again = await client.get(f"/api/jobs/{job_id}")
        assert again.status_code == 200 and again.json() == done
        assert await read_events(client, job_id) == [done]
        # Resuming with Last-Event-ID replays exactly what came after that event.
        assert await read_events(client, job_id, events[0]["version"]) == events[1:]
        assert await read_events(client, job_id, done["version"]) == []


async def test_job_followed_over_sse_goes_queued_running_done_and_stays_readable(
    tight: ServiceProcess, spaces: SpaceFleet
) -> None:
    """SSE of a job queued behind another: queued (with position) → running → done."""
    await follow_queued_job(tight, 3.0)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not os.environ.get("SPACEPOOL_SLOW_TESTS"), reason="SPACEPOOL_SLOW_TESTS=1")
async def test_two_minute_job_followed_over_sse(tight: ServiceProcess, spaces: SpaceFleet) -> None:
    """The long variant: a 2-minute predict followed to the end over one SSE stream."""
    await follow_queued_job(tight, 120.0)


async def test_delete_cancels_a_running_job_upstream_and_frees_its_slot_at_once(
    tight: ServiceProcess, spaces: SpaceFleet
) -> None:
    """DELETE of a running job: cancelled, slot free (pool stats 0) and the Space idle."""
    async with tight.client() as client:
        created = await client.post("/api/jobs", json=echo_job("long", 60.0, timeout_s=120))
        job_id = created.json()["job_id"]

        async def running() -> bool:
            return await stage_of(client, job_id) == "running"

        async def space_busy() -> bool:
            return await asyncio.to_thread(lambda: sum(s.stats().in_flight for s in spaces) == 1)

        await eventually(running, 15, "job running")
        await eventually(space_busy, 15, "the Space running the job")

        started = time.monotonic()
        deleted = await client.delete(f"/api/jobs/{job_id}")
        delete_s = time.monotonic() - started
        assert deleted.status_code == 200
        assert deleted.json()["stage"] == "cancelled"

        async def slot_free() -> bool:
            stats = (await client.get("/api/admin/pool-stats", headers=admin_headers())).json()
            return bool(stats["inUseConnections"] == 0 and stats["admission"]["globalInUse"] == 0)

        free_s = await eventually(slot_free, 2.0, "slot released after DELETE")

        async def space_idle() -> bool:
            return await asyncio.to_thread(lambda: sum(s.stats().in_flight for s in spaces) == 0)

        upstream_s = await eventually(space_idle, 10, "upstream job cancelled")
        # With cap 1 and a 1 s queue deadline, this only succeeds if the slot is free.
        after = await client.post("/api/predict", json=echo_job("after", 0.0))
        assert after.status_code == 200, after.text
        final = await client.get(f"/api/jobs/{job_id}")
        assert final.json()["stage"] == "cancelled"
        again = await client.delete(f"/api/jobs/{job_id}")
        assert again.status_code == 200 and again.json()["stage"] == "cancelled"
    print(
        f"\nDELETE took {delete_s * 1000:.0f} ms; slot free {free_s * 1000:.0f} ms later; "
        f"Space idle after {upstream_s * 1000:.0f} ms"
    )


async def test_failed_job_carries_the_same_error_as_a_predict(tight: ServiceProcess) -> None:
    """A job whose app raises ends failed with {error: upstream, kind: app_error, status}."""
    async with tight.client() as client:
        created = await client.post("/api/jobs", json={"api_name": "/fail", "args": ["j"]})
        events = await read_events(client, created.json()["job_id"])
    final = events[-1]
    assert final["stage"] == "failed"
    assert final["error"]["error"] == "upstream" and final["error"]["status"] == 502
    assert "result" not in final


# -- the in-process store, on its own -------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def record(job_id: str) -> JobRecord:
    return JobRecord(job_id, "queued", created_at=0.0, updated_at=0.0)


async def test_store_keeps_finished_jobs_for_the_retention_then_forgets_them() -> None:
    """A finished job is readable for POOL_JOB_RETENTION_S, then gone; running ones stay."""
    clock = FakeClock()
    store = MemoryJobStore(retention_s=60, max_jobs=10, clock=clock)
    await store.add(record("a"))
    await store.add(record("b"))
    await store.update("a", stage="done", result="x")
    clock.now += 59
    assert (await store.get("a")) is not None
    clock.now += 2
    assert await store.get("a") is None
    assert await store.changes("a", 0, timeout=0) is None
    assert (await store.get("b")) is not None  # not finished: never expires


async def test_store_bound_evicts_the_oldest_finished_job_and_refuses_when_all_run() -> None:
    """At POOL_JOB_MAX the oldest finished job makes room; if none finished, JobsFull."""
    store = MemoryJobStore(retention_s=3600, max_jobs=2, clock=FakeClock())
    await store.add(record("a"))
    await store.add(record("b"))
    await store.update("a", stage="done")
    await store.add(record("c"))
    assert await store.get("a") is None and await store.get("c") is not None
    with pytest.raises(JobsFull):
        await store.add(record("d"))


async def test_store_history_gives_one_view_per_change_and_final_stages_stick() -> None:
    """changes() returns every version after the given one; updates after done are ignored."""
    store = MemoryJobStore(retention_s=3600, max_jobs=5)
    await store.add(record("a"))
    await store.update("a", queue_position=2)
    await store.update("a", queue_position=1)
    await store.update("a", stage="running", queue_position=None)
    await store.update("a", stage="done", result=[1, 2])
    late = await store.update("a", stage="cancelled")
    assert late is not None and late.stage == "done"
    views = await store.changes("a", 1, timeout=0)
    assert views is not None
    assert [(v["version"], v["stage"], v.get("queue_position")) for v in views] == [
        (2, "queued", 2),
        (3, "queued", 1),
        (4, "running", None),
        (5, "done", None),
    ]
    assert views[-1]["result"] == [1, 2]


async def test_store_changes_wakes_a_waiter_on_update_and_times_out_quietly() -> None:
    """A watcher blocked in changes() wakes on the next update; with none, it gets []."""
    store = MemoryJobStore(retention_s=3600, max_jobs=5)
    await store.add(record("a"))
    assert await store.changes("a", 1, timeout=0.01) == []
    waiter = asyncio.create_task(store.changes("a", 1, timeout=10))
    done, _ = await asyncio.wait({waiter}, timeout=0.05)
    assert not done  # blocked: nothing new yet
    await store.update("a", stage="running")
    views = await asyncio.wait_for(waiter, 1)
    assert views is not None and [v["stage"] for v in views] == ["running"]
