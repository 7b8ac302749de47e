"""Jobs are readable and cancellable from any worker sharing the coordinator."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.core._settings import ServiceSettings
from app.jobs import JobRecord, MemoryJobStore
from app.jobs._shared import SharedJobStore
from app.main import create_app
from devspaces import SpaceFleet
from pool import Pool, PoolSettings, set_pool
from pool.admission import open_coordinator
from tests.admission.conftest import SHARED_STORES, make_url


@pytest.fixture(params=SHARED_STORES)
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh SQLite file or Redis prefix (removed afterwards)."""
    yield from make_url(request.param, tmp_path, "shared")


@pytest.fixture
async def two_workers(
    fleet: SpaceFleet, shared_url: str
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, Pool]]:
    """Two app instances (two workers' job runners), each with its own pool, over one
    shared store. (One pool shared by both apps was closed by the first lifespan to end
    while the other's job runner still wrote to the store: a Redis connection was
    reopened after its client closed, and leaked.)"""
    settings = PoolSettings(
        spaces=fleet.pool_spaces_env(), coordinator_url=shared_url, lease_ttl_s=3.0
    )
    pools = [Pool(settings), Pool(settings)]
    apps: list[FastAPI] = [create_app(ServiceSettings()) for _ in range(2)]
    try:
        async with contextlib.AsyncExitStack() as stack:
            for app, pool in zip(apps, pools, strict=True):
                set_pool(pool)  # each lifespan takes the process-wide pool as it starts
                await stack.enter_async_context(app.router.lifespan_context(app))
            clients = [
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://w", timeout=30
                )
                for app in apps
            ]
            yield clients[0], clients[1], pools[0]
            for client in clients:
                await client.aclose()
    finally:
        set_pool(None)


async def test_job_created_on_one_worker_is_read_on_another(
    two_workers: tuple[httpx.AsyncClient, httpx.AsyncClient, Pool],
) -> None:
    """A job started on worker A is followed to done through worker B (GET and SSE)."""
    a, b, _ = two_workers
    created = await a.post("/api/jobs", json={"api_name": "/echo", "args": ["hi", 1.0]})
    assert created.status_code == 202
    job_id = created.json()["job_id"]
    first = await b.get(f"/api/jobs/{job_id}")
    assert first.status_code == 200 and first.json()["stage"] in ("queued", "running")
    stages: list[str] = []
    async with b.stream("GET", f"/api/jobs/{job_id}/events") as stream:
        async for line in stream.aiter_lines():
            if line.startswith("data:"):
                stages.append(json.loads(line[5:])["stage"])
    assert stages[-1] == "done", stages
    final = (await b.get(f"/api/jobs/{job_id}")).json()
    assert final["stage"] == "done" and final["result"].endswith(":hi")
    assert (await b.get("/api/jobs/nope-not-a-job")).status_code == 404


async def test_job_cancelled_from_another_worker(
    two_workers: tuple[httpx.AsyncClient, httpx.AsyncClient, Pool],
) -> None:
    """DELETE on worker B cancels the job that runs on worker A and frees its slot."""
    a, b, pool = two_workers
    created = await a.post("/api/jobs", json={"api_name": "/echo", "args": ["long", 30.0]})
    job_id = created.json()["job_id"]
    for _ in range(200):
        if (await b.get(f"/api/jobs/{job_id}")).json()["stage"] == "running":
            break
        await asyncio.sleep(0.05)
    cancelled = await b.delete(f"/api/jobs/{job_id}")
    assert cancelled.status_code == 200
    assert cancelled.json()["stage"] == "cancelled"
    assert (await a.get(f"/api/jobs/{job_id}")).json()["stage"] == "cancelled"
    stats = await pool.stats()
    assert stats["inUseConnections"] == 0 and stats["admission"]["globalInUse"] == 0


async def test_idempotency_key_gives_one_job(
    two_workers: tuple[httpx.AsyncClient, httpx.AsyncClient, Pool], clean_fleet: SpaceFleet
) -> None:
    """The same Idempotency-Key sent 5 times, to either worker, is one job and one call at
    the Space; another caller with the same key gets a job of their own."""
    a, b, _ = two_workers
    body = {"api_name": "/echo", "args": ["once", 0.5], "email": "idem@example.com"}
    headers = {"Idempotency-Key": "retry-7f3a"}
    answers = [await (a, b)[i % 2].post("/api/jobs", json=body, headers=headers) for i in range(5)]
    assert [r.status_code for r in answers] == [202] * 5
    ids = {r.json()["job_id"] for r in answers}
    assert len(ids) == 1, ids
    assert [r.headers.get("Idempotent-Replayed") for r in answers[1:]] == ["true"] * 4
    job_id = ids.pop()
    for _ in range(200):
        if (await b.get(f"/api/jobs/{job_id}")).json()["stage"] == "done":
            break
        await asyncio.sleep(0.05)
    assert (await a.get(f"/api/jobs/{job_id}")).json()["stage"] == "done"
    assert sum(space.stats().total for space in clean_fleet) == 1
    other = await a.post("/api/jobs", json={**body, "email": "other@example.com"}, headers=headers)
    assert other.status_code == 202 and other.json()["job_id"] != job_id


async def test_a_dead_owners_jobs_run_again_or_end(
    two_workers: tuple[httpx.AsyncClient, httpx.AsyncClient, Pool], clean_fleet: SpaceFleet
) -> None:
    """Jobs of a worker whose heartbeat is gone: a queued one runs again (same id,
    requeued 1, done), a running one not safe_to_retry fails worker_lost, one past its
    deadline fails "deadline" — each within about one TTL."""
    a, _, pool = two_workers
    values = pool.coordinator.values
    now = time.time()
    body = {"api_name": "/echo", "args": ["again", 0.1], "safe_to_retry": False}
    cases = {"queued": ("queued", now + 60), "running": ("running", now + 60),
             "late": ("queued", now - 10)}  # fmt: skip
    for job_id, (stage, deadline) in cases.items():
        record = JobRecord(job_id, stage, created_at=now, updated_at=now, owner="ghost-1")
        await values.put(f"job:{job_id}", json.dumps(asdict(record)), ttl_s=60)
        index = {"owner": "ghost-1", "deadline": deadline, "body": body}
        await values.put(f"jobrun:{job_id}", json.dumps(index), ttl_s=60)
    started = time.monotonic()
    views: dict[str, dict[str, Any]] = {}
    while time.monotonic() - started < 15:
        views = {job_id: (await a.get(f"/api/jobs/{job_id}")).json() for job_id in cases}
        if all(v["stage"] in ("done", "failed") for v in views.values()):
            break
        await asyncio.sleep(0.1)
    took = time.monotonic() - started
    assert views["queued"]["stage"] == "done" and views["queued"]["requeued"] == 1, views
    assert views["queued"]["result"].endswith(":again")
    assert views["running"]["error"]["error"] == "worker_lost", views
    assert views["late"]["error"]["error"] == "deadline", views
    assert took < 3.0 + 5, took
    assert sum(space.stats().total for space in clean_fleet) == 1


@pytest.fixture
async def two_stores(shared_url: str) -> AsyncIterator[tuple[SharedJobStore, SharedJobStore]]:
    """Two workers' job stores (two coordinators, as two processes) over one store."""
    coordinators = [open_coordinator(shared_url, lease_ttl_s=3.0) for _ in range(2)]
    stores = []
    for coordinator in coordinators:
        local = MemoryJobStore(retention_s=60, max_jobs=100)
        stores.append(SharedJobStore(local, lambda c=coordinator: c.values, 60, 3.0))
    try:
        yield stores[0], stores[1]
    finally:
        for coordinator in coordinators:
            await coordinator.aclose()


async def _running(store: SharedJobStore, job_id: str) -> JobRecord:
    now = time.time()
    record = JobRecord(job_id, "queued", created_at=now, updated_at=now, owner=store.worker)
    await store.add(record)
    return await store.update(job_id, stage="running", space="alpha") or record


async def test_a_cancel_request_reaches_the_owner_at_once(
    two_stores: tuple[SharedJobStore, SharedJobStore],
) -> None:
    """B asks to cancel A's job: A's watch of it answers "cancel" within a second
    (signalled: nothing polls for it), and the request is consumed."""
    a, b = two_stores
    await _running(a, "job-c")
    stopped = asyncio.create_task(a.stopped("job-c"))
    await asyncio.sleep(0)  # it watches from here on
    started = time.monotonic()
    assert await b.request_cancel("job-c")
    assert await asyncio.wait_for(stopped, 5) == "cancel"
    assert time.monotonic() - started < 1.0


async def test_a_taken_over_owner_is_told_and_fenced(
    two_stores: tuple[SharedJobStore, SharedJobStore],
) -> None:
    """B settles A's job (a takeover raising the fencing token): A's watch answers
    "lost", A's later write is refused and A then reads B's record."""
    a, b = two_stores
    await _running(a, "job-t")
    stopped = asyncio.create_task(a.stopped("job-t"))
    await asyncio.sleep(0)
    settled = await b.settle("job-t", stage="cancelled", error={"error": "cancelled"})
    assert settled is not None and settled.fence == 1 and settled.owner == b.worker
    assert await asyncio.wait_for(stopped, 5) == "lost"
    after = await a.update("job-t", stage="done", result="late")
    assert after is not None and after.stage == "cancelled" and after.owner == b.worker
    assert await a.local.get("job-t") is None


async def test_another_workers_change_reaches_a_waiting_reader(
    two_stores: tuple[SharedJobStore, SharedJobStore],
) -> None:
    """B waits for A's job to change (as its SSE stream does): A's update wakes it
    within a second, with the new version."""
    a, b = two_stores
    record = await _running(a, "job-w")
    waiting = asyncio.create_task(b.changes("job-w", record.version, timeout=10))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await a.update("job-w", stage="done", result="r")
    views = await asyncio.wait_for(waiting, 10)
    assert views and views[-1]["stage"] == "done" and views[-1]["version"] > record.version
    assert time.monotonic() - started < 1.0
