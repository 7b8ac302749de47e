"""The HTTP service while its Redis is unreachable: fail closed, then recover by itself."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from devspaces import SpaceFleet
from tests.service.conftest import ServiceProcess, service_env

from ._infra import PrivateRedis
from .conftest import LEASE_TTL_S
from .test_fencing import until

OUTAGE_S = 10.0


async def test_store_outage_admits_nothing_and_recovers_within_2_s(
    clean_fleet: SpaceFleet, private_redis: PrivateRedis, tmp_path: Path
) -> None:
    """Redis frozen 10 s under traffic: no call starts at a Space meanwhile, the long
    call running at the freeze is cancelled before its lease could expire in the
    store (503 lease_lost), every answer is a 200 or a typed 503 with Retry-After
    (never a 500), and calls start again within 2 s of the store's return."""
    env = service_env(
        clean_fleet, tmp_path,
        POOL_COORDINATOR_URL=f"{private_redis.url}?prefix=outage:",
        POOL_LEASE_TTL_S=str(LEASE_TTL_S), POOL_GLOBAL_MAX_CONCURRENT="3",
        POOL_QUEUE_TIMEOUT_S="5",
    )  # fmt: skip
    service = await asyncio.to_thread(ServiceProcess, env, tmp_path / "service.log")
    answers: list[tuple[float, int, httpx.Response]] = []
    stop = asyncio.Event()
    in_flight = lambda: sum(s.stats().in_flight for s in clean_fleet)  # noqa: E731
    base = in_flight()  # calls an earlier test left running

    async def caller(http: httpx.AsyncClient) -> None:
        while not stop.is_set():
            sent = time.time()
            response = await http.post("/api/predict", json={"api_name": "/echo",
                                                             "args": ["x", 0.3]})
            answers.append((sent, response.status_code, response))
            if response.status_code != 200:
                await asyncio.sleep(0.1)

    try:
        async with service.client() as http:
            long = asyncio.create_task(
                http.post("/api/predict", json={"api_name": "/echo", "args": ["long", 30]})
            )
            await until(lambda: in_flight() == base + 1, 20, "the long call to run")
            callers = [asyncio.create_task(caller(http)) for _ in range(2)]
            await until(lambda: sum(a[1] == 200 for a in answers) >= 3, 20, "traffic")
            frozen_at = time.time()
            private_redis.freeze()
            await asyncio.sleep(OUTAGE_S)  # the outage itself
            back_at = time.time()
            private_redis.thaw()
            await until(lambda: any(s > back_at and c == 200 for s, c, _ in answers), 10,
                        "a request served after the store's return")  # fmt: skip
            stop.set()
            await asyncio.gather(*callers)
            fenced = await long
    finally:
        service.stop()
    intervals = sorted(i for sp in clean_fleet for i in sp.intervals())
    starts = [s for s, _ in intervals]
    during = [s for s in starts if frozen_at + 0.5 < s < back_at]
    first_back = min(s for s in starts if s >= back_at) - back_at
    (long_end,) = [e for s, e in intervals if s < frozen_at and e - s > 1.0]
    codes = sorted({c for _, c, _ in answers})
    refused = [r for _, c, r in answers if c == 503]
    reasons = sorted({str(r.json().get("reason")) for r in refused})
    print(f"{len(answers)} answers, codes {codes}, 503 reasons {reasons}; long call ended "
          f"{long_end - frozen_at:.2f} s into the outage; first call at a Space "
          f"{first_back:.2f} s after the store's return")  # fmt: skip
    assert during == [], f"{len(during)} calls started while the store was down"
    assert fenced.status_code == 503 and fenced.json()["reason"] == "lease_lost", fenced.text
    assert fenced.headers.get("Retry-After")
    assert long_end - frozen_at < LEASE_TTL_S, "the long call outlived its lease"
    assert set(codes) <= {200, 503}
    assert refused, "the outage was not noticed"
    assert all(r.headers.get("Retry-After") and r.json()["error"] == "busy" for r in refused)
    assert first_back <= 2.0
