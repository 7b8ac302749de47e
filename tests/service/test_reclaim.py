"""Jobs outlive their worker: a killed or frozen owner's jobs end or run again, nothing
hangs; an ``Idempotency-Key`` retry gets the first job (real uvicorn workers, signals)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devspaces import SpaceProcess
from tests.service.conftest import ServiceProcess, admin_headers, service_env
from tests.service.test_keys import bearer, create_key

TTL_S = 3.0
JOBS = 8
JOB_S = 40.0
FINAL = {"done", "failed", "cancelled"}


@pytest.fixture
def lone_space() -> Iterator[SpaceProcess]:
    """A stand-in Space of the test's own: lost calls run on there after the test."""
    space = SpaceProcess("lost")
    try:
        yield space
    finally:
        space.stop()


@pytest.fixture
def service(lone_space: SpaceProcess, tmp_path: Path) -> Iterator[ServiceProcess]:
    """Two uvicorn workers over ``lone_space``, sharing an SQLite coordinator."""
    env = service_env(
        f"lost={lone_space.url}",
        tmp_path,
        POOL_LEASE_TTL_S=str(TTL_S),
        # Some of the eight jobs wait in the queue: the Space's window starts at 4
        # (POOL_WINDOW_INITIAL) under a global cap of 6.
        POOL_GLOBAL_MAX_CONCURRENT="6",
        POOL_CONSUMER_MAX_CONCURRENT="8",
        # uvicorn kills a worker that misses its health check for 5 s: a frozen worker
        # would be a killed one. Let it stay frozen (and wake) here.
        UVICORN_TIMEOUT_WORKER_HEALTHCHECK="60",
    )
    started = ServiceProcess(env, tmp_path / "service.log", workers=2)
    try:
        yield started
    finally:
        started.stop()


def fresh_client(service: ServiceProcess, **kwargs: Any) -> httpx.AsyncClient:
    """A client that opens a new connection per request: one kept alive to a frozen
    worker would hang (a new one goes to a worker that accepts)."""
    limits = httpx.Limits(max_keepalive_connections=0)
    return httpx.AsyncClient(base_url=service.url, timeout=30, limits=limits, **kwargs)


async def follow(client: httpx.AsyncClient, job_id: str) -> list[dict[str, Any]]:
    """Read the job's SSE stream to its final event, reconnecting (with Last-Event-ID)
    when the worker serving it dies, as an EventSource does."""
    seen: list[dict[str, Any]] = []
    for _ in range(20):
        headers = {"Last-Event-ID": str(seen[-1]["version"])} if seen else {}
        try:
            async with client.stream(
                "GET", f"/api/jobs/{job_id}/events", headers=headers, timeout=None
            ) as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("data: "):
                        seen.append(json.loads(line[6:]))
                        if seen[-1]["stage"] in FINAL:
                            return seen
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.2)
    return seen


async def submit_all(client: httpx.AsyncClient) -> list[tuple[str, bool]]:
    """Eight 40 s jobs, every other one safe_to_retry; their ids and retryability."""
    jobs = []
    for i in range(JOBS):
        retry = i % 2 == 0
        body = {"api_name": "/echo", "args": [f"j{i}", JOB_S], "safe_to_retry": retry}
        answer = await client.post("/api/jobs", json=body)
        assert answer.status_code == 202, answer.text
        jobs.append((answer.json()["job_id"], retry))
    return jobs


def busiest_worker(service: ServiceProcess) -> tuple[int, int]:
    """The worker pid that accepted the most job submissions, and how many."""
    counts: dict[int, int] = {}
    for line in service.log_lines():
        if line.get("method") == "POST" and line.get("path") == "/api/jobs":
            counts[line["pid"]] = counts.get(line["pid"], 0) + 1
    pid = max(counts, key=lambda p: counts[p])
    return pid, counts[pid]


async def wait_taken(
    client: httpx.AsyncClient, jobs: list[tuple[str, bool]], expected: int, within_s: float
) -> dict[str, dict[str, Any]]:
    """Poll until ``expected`` jobs are final or were taken over (or time is up); the
    views then."""
    deadline = time.monotonic() + within_s
    while True:
        views = {job_id: (await client.get(f"/api/jobs/{job_id}")).json() for job_id, _ in jobs}
        if len(taken(views)) >= expected or time.monotonic() > deadline:
            return views
        await asyncio.sleep(0.2)


def taken(views: dict[str, dict[str, Any]]) -> list[str]:
    return [j for j, v in views.items() if v.get("requeued") or v["stage"] in FINAL]


def check_taken(views: dict[str, dict[str, Any]], jobs: list[tuple[str, bool]]) -> None:
    """A taken job runs again (requeued) unless it reached the Space and was not
    retryable: then it failed with worker_lost."""
    retryable = dict(jobs)
    for job_id in taken(views):
        view = views[job_id]
        if view["stage"] == "failed":
            assert view["error"]["error"] == "worker_lost", view
            assert not retryable[job_id], view
        else:
            assert view["requeued"] == 1 and view["stage"] in ("queued", "running"), view


async def cancel_all(client: httpx.AsyncClient, jobs: list[tuple[str, bool]]) -> list[float]:
    """DELETE every job; how long each answer took."""
    took = []
    for job_id, _ in jobs:
        started = time.monotonic()
        answer = await client.delete(f"/api/jobs/{job_id}")
        took.append(time.monotonic() - started)
        assert answer.status_code == 200, answer.text
        assert answer.json()["stage"] in FINAL, answer.json()
    return took


async def test_killed_worker_jobs_end_or_run_again(
    service: ServiceProcess, lone_space: SpaceProcess
) -> None:
    """SIGKILL of the worker owning jobs: each is requeued or failed worker_lost within
    TTL + 5 s, every SSE stream ends final, DELETE answers < 1 s, nothing runs twice."""
    async with fresh_client(service) as client:
        jobs = await submit_all(client)
        streams = [asyncio.create_task(follow(client, job_id)) for job_id, _ in jobs]
        await asyncio.sleep(2.0)
        pid, owned = busiest_worker(service)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        views = await wait_taken(client, jobs, owned, TTL_S + 5)
        assert len(taken(views)) == owned, (time.monotonic() - killed, views)
        check_taken(views, jobs)
        took = await cancel_all(client, jobs)
        assert max(took) < 1.0, took
        seen = await asyncio.wait_for(asyncio.gather(*streams), 20)
    assert all(events and events[-1]["stage"] in FINAL for events in seen), seen
    requeued = [j for j, v in views.items() if v.get("requeued")]
    for (job_id, _), events in zip(jobs, seen, strict=True):
        if job_id in requeued:  # the stream went on, carrying the requeue
            # Usually as a queued/running event; a stream that follows the job from
            # another worker reads its mirror when woken, and when the test's DELETE
            # ends the requeued job at once, the final event may be the first to show it.
            assert any(e.get("requeued") == 1 for e in events), events
    retried = sum(1 for job_id, retry in jobs if retry and job_id in requeued)
    assert lone_space.stats().total <= JOBS + retried


async def test_frozen_worker_does_not_run_taken_jobs(
    service: ServiceProcess, lone_space: SpaceProcess
) -> None:
    """SIGSTOP of the owner past its TTL: its jobs are taken over; after SIGCONT it does
    not overwrite them nor keep running them (the Space runs only the live jobs)."""
    async with fresh_client(service) as client:
        jobs = await submit_all(client)
        await asyncio.sleep(2.0)
        pid, owned = busiest_worker(service)
        os.kill(pid, signal.SIGSTOP)
        try:
            views = await wait_taken(client, jobs, owned, TTL_S + 5)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert len(taken(views)) == owned, views
        check_taken(views, jobs)
        await asyncio.sleep(TTL_S)  # the woken worker's sweep has run
        after = {job_id: (await client.get(f"/api/jobs/{job_id}")).json() for job_id, _ in jobs}
        for job_id in taken(views):  # the fleet's decision stands
            assert after[job_id].get("requeued") == views[job_id].get("requeued")
            assert (after[job_id]["stage"] == "failed") == (views[job_id]["stage"] == "failed")
        running = sum(1 for view in after.values() if view["stage"] == "running")
        assert lone_space.stats().in_flight == running, after
        await cancel_all(client, jobs)


async def test_a_reclaimed_job_runs_as_its_api_keys(
    service: ServiceProcess, lone_space: SpaceProcess
) -> None:
    """Jobs made with API keys, taken over from a killed worker: those of a live key run
    again as that key's (its limit of 1 holds: one running at a time), those of a key
    revoked meanwhile fail ``key_revoked`` instead of running again."""
    kept = await create_key(service, name="kept", max_concurrent=1)
    gone = await create_key(service, name="gone", max_concurrent=4)
    owners: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as one:  # one worker
        for key in (kept, gone):
            for i in range(3):
                body = {"api_name": "/echo", "args": [f"{key['name']}{i}", 4.0],
                        "safe_to_retry": True}  # fmt: skip
                answer = await one.post("/api/jobs", json=body, headers=bearer(key["key"]))
                assert answer.status_code == 202, answer.text
                owners[answer.json()["job_id"]] = key["name"]
    async with service.client(**admin_headers()) as admin:
        assert (await admin.delete(f"/api/admin/keys/{gone['id']}")).status_code == 204
    pid, owned = busiest_worker(service)
    assert owned == 6
    killed_at = time.time()  # the Space's clock: the same host's
    os.kill(pid, signal.SIGKILL)
    async with fresh_client(service, headers=admin_headers()) as client:  # every key's jobs
        deadline = time.monotonic() + TTL_S + 30
        while True:
            views = {j: (await client.get(f"/api/jobs/{j}")).json() for j in owners}
            if all(v["stage"] in FINAL for v in views.values()):
                break
            assert time.monotonic() < deadline, views
            await asyncio.sleep(0.2)
    for job_id, name in owners.items():
        view = views[job_id]
        if name == "gone":
            assert view["stage"] == "failed" and view["error"]["error"] == "key_revoked", view
        else:
            assert view["stage"] == "done" and view["requeued"] == 1, view
    # At the Space, by its clock: the calls started after the takeover are the kept
    # key's three, run again by the living worker one after the other (its limit of 1).
    # No takeover comes before 2/3 TTL after the kill (the heartbeat was at most a third
    # of a TTL old); calls joined before the kill may start at the Space just after it.
    again = sorted(c for c in lone_space.calls() if c[0] > killed_at + TTL_S / 2)
    assert sorted(text for *_, text in again) == ["kept0", "kept1", "kept2"], again
    assert all(b[0] >= a[1] for a, b in itertools.pairwise(again)), again
