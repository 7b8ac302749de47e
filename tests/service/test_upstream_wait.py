"""A wait at the Space is visible over HTTP whatever its rank (issue 31): a call first in
the queue of a Space whose workers another client holds (rank 0) shows
``upstream_rank: 0`` with ``upstream_queue_size`` on the predict stream and on the job's
SSE, until the Space starts it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devspaces import SpaceProcess
from pool import Pool, PoolSettings
from tests.service.conftest import ServiceProcess, service_env
from tests.service.test_jobs import read_events


@pytest.fixture(scope="module")
def narrow() -> Iterator[SpaceProcess]:
    """A Space running 2 calls at once with room for 1 waiting."""
    with SpaceProcess("narrowh", concurrency_limit=2, max_size=1) as space:
        yield space


@pytest.fixture(scope="module")
def service(
    narrow: SpaceProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    directory: Path = tmp_path_factory.mktemp("upstream-wait")
    env = service_env(f"narrowh={narrow.url}", directory, POOL_MIN_CONNECTIONS="1")
    started = ServiceProcess(env, directory / "service.log")
    try:
        yield started
    finally:
        started.stop()


async def _outside_client_holds_both_workers(narrow: SpaceProcess, pool: Pool) -> list[Any]:
    """Two 2 s calls of another client, running at the Space."""
    running = [asyncio.create_task(pool.predict("/echo", f"o{i}", 2.0)) for i in range(2)]
    async with asyncio.timeout(20):
        while narrow.stats().in_flight < 2:
            await asyncio.sleep(0.01)
    return running


def _outside(narrow: SpaceProcess) -> Pool:
    return Pool(PoolSettings(spaces=f"narrowh={narrow.url}",  # type: ignore[arg-type]
                             coordinator_url="memory://"))  # fmt: skip


def _waits_at_rank_zero(events: list[dict[str, Any]]) -> None:
    """Rank 0 (queue size 1) shown while running, then cleared before the result."""
    ranks = [i for i, e in enumerate(events) if e.get("upstream_rank") == 0]
    assert ranks, events
    first = events[ranks[0]]
    assert first["stage"] == "running" and first["upstream_queue_size"] == 1, first
    assert events[-1]["stage"] == "done" and "upstream_rank" not in events[-1], events[-1]


async def test_rank_zero_is_shown_on_the_predict_stream(
    narrow: SpaceProcess, service: ServiceProcess
) -> None:
    outside = _outside(narrow)
    try:
        running = await _outside_client_holds_both_workers(narrow, outside)
        events: list[dict[str, Any]] = []
        async with service.client() as client:
            body = {"api_name": "/echo", "args": ["ours", 0.1], "stream": True}
            async with client.stream("POST", "/api/predict", json=body) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
        await asyncio.gather(*running)
    finally:
        await outside.aclose()
    print("\nstream:", [{k: v for k, v in e.items() if k != "result"} for e in events])
    _waits_at_rank_zero(events)
    assert events[-1]["result"] == "narrowh:ours"


async def test_rank_zero_is_shown_on_the_job_events(
    narrow: SpaceProcess, service: ServiceProcess
) -> None:
    outside = _outside(narrow)
    try:
        running = await _outside_client_holds_both_workers(narrow, outside)
        async with service.client() as client:
            created = await client.post("/api/jobs", json={"api_name": "/echo",
                                                           "args": ["job", 0.1]})  # fmt: skip
            assert created.status_code == 202
            events = await read_events(client, created.json()["job_id"])
        await asyncio.gather(*running)
    finally:
        await outside.aclose()
    print("\njob:", [{k: v for k, v in e.items() if k != "result"} for e in events])
    _waits_at_rank_zero(events)
    assert events[-1]["result"] == "narrowh:job"
