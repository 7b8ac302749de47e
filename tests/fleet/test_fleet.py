"""The global cap across real processes and real Spaces, for every shared store."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devspaces import SpaceFleet, free_port
from pool import Pool, PoolSettings
from tests.admission.conftest import make_url
from tests.service.conftest import tls


@pytest.fixture(scope="module")
def fleet3() -> Iterator[SpaceFleet]:
    """Three stand-in Spaces for the fleet tests."""
    with SpaceFleet(3) as spaces:
        yield spaces


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    peak = running = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


@pytest.fixture(params=["sqlite", "redis"])
def fleet_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh shared store (SQLite file or private Redis prefix)."""
    yield from make_url(request.param, tmp_path, "fleet")


def test_four_processes_never_exceed_the_caps(fleet3: SpaceFleet, fleet_url: str) -> None:
    """4 processes × 100 requests, caps 5/3/2: the Spaces see ≤ 5 total, ≤ 3 each."""
    fleet3.reset()
    env = {
        **os.environ,
        "PYTHONPATH": os.getcwd(),
        "POOL_GLOBAL_MAX_CONCURRENT": "5",
        "POOL_MAX_CONNECTIONS": "3",
        "POOL_MIN_CONNECTIONS": "1",
        "POOL_CONSUMER_MAX_CONCURRENT": "2",
        "POOL_QUEUE_TIMEOUT_S": "300",
        "POOL_LEASE_TTL_S": "5",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.fleet.worker", fleet3.pool_spaces_env(),
             fleet_url, "100", f"p{n}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
        )
        for n in range(4)
    ]
    records: list[dict[str, object]] = []
    for proc in procs:
        out, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, err[-2000:]
        records += json.loads(out.strip().splitlines()[-1])
    assert len(records) == 400
    assert all(r.get("ok") is True for r in records), [r for r in records if not r.get("ok")][:5]
    assert fleet3.concurrent_peak() <= 5
    assert fleet3.concurrent_peak() >= 3, "the cap should be used, not just respected"
    assert all(space.stats().peak <= 3 for space in fleet3)
    by_user: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        by_user.setdefault(str(r["user"]), []).append((float(r["start"]), float(r["end"])))  # type: ignore[arg-type]
    assert max(_max_overlap(v) for v in by_user.values()) <= 2


async def test_heavy_user_does_not_delay_a_light_one(fleet3: SpaceFleet, tmp_path: Path) -> None:
    """50 queued requests of one user do not delay another user's single request."""
    url = next(make_url("sqlite", tmp_path, "heavy"))
    pool = Pool(
        PoolSettings(
            spaces=fleet3.pool_spaces_env(), coordinator_url=url, global_max_concurrent=5,
            consumer_max_concurrent=2, queue_timeout_s=120,
        )
    )
    service_s = 1.0
    try:
        async def call(email: str) -> float:
            asked = time.monotonic()
            async with pool.client(email) as client:
                waited = time.monotonic() - asked
                await client.predict("x", service_s, api_name="/echo")
            return waited

        heavy = [asyncio.create_task(call("heavy@example.com")) for _ in range(50)]
        while (await pool.stats())["totalQueued"] < 48:
            await asyncio.sleep(0.05)
        light_wait = await call("light@example.com")
        assert light_wait < service_s, light_wait
        for task in heavy:
            task.cancel()
        await asyncio.gather(*heavy, return_exceptions=True)
    finally:
        await pool.aclose()


def test_uvicorn_workers_share_the_default_coordinator(
    fleet3: SpaceFleet, tmp_path: Path
) -> None:
    """uvicorn --workers 3, SQLite coordinator, cap 3: 30 × 1 s predicts in ≤ 1.3 × 10 s."""
    fleet3.reset()
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.getcwd(),
        "POOL_SPACES": fleet3.pool_spaces_env(),
        "POOL_COORDINATOR_URL": f"sqlite:///{tmp_path}/workers/coordinator.db",
        "POOL_GLOBAL_MAX_CONCURRENT": "3",
        "POOL_CONSUMER_MAX_CONCURRENT": "3",
        "POOL_MIN_CONNECTIONS": "2",
        "POOL_QUEUE_TIMEOUT_S": "60",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--workers", "3",
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1, verify=tls()).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "uvicorn did not come up"
            time.sleep(0.2)

        async def run() -> tuple[float, list[int]]:
            async with httpx.AsyncClient(base_url=base, timeout=60) as http:
                # Warm every worker's connections first (not part of the timing).
                await asyncio.gather(*(
                    http.post("/api/predict", json={"api_name": "/echo", "args": ["w", 0]})
                    for _ in range(9)
                ))
                fleet3.reset()
                started = time.monotonic()
                replies = await asyncio.gather(*(
                    http.post("/api/predict", json={
                        "email": f"u{i % 10}@example.com", "api_name": "/echo",
                        "args": [str(i), 1.0],
                    })
                    for i in range(30)
                ))
                return time.monotonic() - started, [r.status_code for r in replies]

        elapsed, codes = asyncio.run(run())
        assert codes == [200] * 30, codes
        assert fleet3.concurrent_peak() <= 3
        assert elapsed <= 13.0, f"30 one-second predicts took {elapsed:.1f}s (ideal 10 s)"
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=15)
        if server.stderr is not None:
            server.stderr.close()


async def test_pool_stats_cover_the_whole_fleet(fleet3: SpaceFleet, tmp_path: Path) -> None:
    """Any pool on a shared store reports every process's connections and the queue."""
    url = next(make_url("sqlite", tmp_path, "stats"))
    pools = [
        Pool(PoolSettings(spaces=fleet3.pool_spaces_env(), coordinator_url=url,
                          min_connections=2, max_connections=4))
        for _ in range(2)
    ]
    try:
        await pools[1].start()  # started, as the app's lifespan does, but never used
        async with pools[0].client(space="alpha") as client:
            await client.predict("x", 0, api_name="/echo")
            while pools[0].spaces["alpha"].total < 2:
                await asyncio.sleep(0.05)
            # Each process publishes its snapshot every 2 s: wait for a fresh one.
            deadline = time.monotonic() + 10
            while True:
                stats = await pools[1].stats()
                if stats["pools"]["alpha"]["totalConnections"] == 2 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            assert stats["processes"] == 2
            assert stats["pools"]["alpha"]["totalConnections"] == 2
            assert stats["pools"]["alpha"]["inUseConnections"] == 1
            assert stats["inUseConnections"] == 1
            assert stats["admission"]["globalInUse"] == 1
        await pools[0].aclose()
        after = await pools[1].stats()
        assert after["processes"] == 1 and after["totalConnections"] == 0
    finally:
        for pool in pools:
            await pool.aclose()
