"""Identities are claims (issue 28, finding 8): whoever sends an email is bounded per user.

Real services over the stand-in Spaces: anonymous callers share one consumer in
admission (``POOL_ANONYMOUS_MAX_CONCURRENT``), so a flood of them cannot starve a named
user; one email (or every anonymous caller together) holds at most
``POOL_MAX_SESSIONS_PER_USER`` open sessions and ``POOL_MAX_QUEUED_JOBS_PER_USER`` jobs
not yet final, counted across two worker processes sharing one SQLite coordinator;
beyond, 429 with ``Retry-After``. Then the counting itself (pool/_holdings.py) on
in-memory values with a fake clock: ended members are found and dropped, members being
set up are not.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from devspaces import SpaceFleet
from pool import Clock, UserLimitReached
from pool._holdings import Holdings
from pool.admission._values import MemoryValues
from tests.conftest import PoolMaker
from tests.service.conftest import ServiceFactory, ServiceProcess, admin_headers, eventually

SLOW_S = 60.0  # a job that holds its slot for the whole test (cancelled at the end)


def echo(text: str, delay_s: float, **extra: Any) -> dict[str, Any]:
    return {"api_name": "/echo", "args": [text, delay_s], **extra}


async def cancel_all(http: httpx.AsyncClient, job_ids: list[str]) -> None:
    """DELETE every job (their slots back, their Spaces idle)."""
    for job_id in job_ids:
        await http.delete(f"/api/jobs/{job_id}")


def assert_429(response: httpx.Response, error: str, limit: int) -> None:
    assert response.status_code == 429, response.text
    body = response.json()
    assert body["error"] == error and body["limit"] == limit, body
    assert int(response.headers["Retry-After"]) >= 1
    assert body["retry_after_s"] == int(response.headers["Retry-After"])
    assert body["message"]


# -- anonymous callers share one consumer ---------------------------------------------------


@pytest.fixture(scope="module")
def flooded(start_service: ServiceFactory) -> ServiceProcess:
    """Global cap 3, every anonymous caller together 1; predicts wait 10 s at most."""
    return start_service(
        POOL_GLOBAL_MAX_CONCURRENT="3",
        POOL_ANONYMOUS_MAX_CONCURRENT="1",
        POOL_QUEUE_TIMEOUT_S="10",
        POOL_JOB_QUEUE_TIMEOUT_S="120",
    )


@pytest.mark.timeout(180)
async def test_an_anonymous_flood_cannot_starve_a_named_user(
    flooded: ServiceProcess, spaces: SpaceFleet
) -> None:
    """20 slow anonymous jobs: one runs (their shared consumer's cap), 19 wait, and a
    named user's predict is admitted at once past them (before: 3 took every global slot
    and the named user queued behind 17, then 503 after the queue timeout)."""
    async with flooded.client() as http:
        created = [await http.post("/api/jobs", json=echo(f"anon{i}", SLOW_S)) for i in range(20)]
        assert all(r.status_code == 202 for r in created), [r.text for r in created]
        job_ids = [r.json()["job_id"] for r in created]
        try:

            async def flooded_in() -> bool:  # every job holds its slots or waits for them
                stats = (await http.get("/api/admin/pool-stats", headers=admin_headers())).json()
                return bool(stats["admission"]["globalInUse"] + stats["totalQueued"] >= 20)

            await eventually(flooded_in, 20, "anonymous jobs running and queued")
            started = time.monotonic()
            named = await http.post(
                "/api/predict", json=echo("mine", 0.0, email="named@example.com")
            )
            took = time.monotonic() - started
            assert named.status_code == 200, named.text
            assert named.json()["result"].endswith(":mine")
            assert took < 5.0 and named.json()["queued_ms"] < 2000, (took, named.json())
            stats = (await http.get("/api/admin/pool-stats", headers=admin_headers())).json()
            assert stats["admission"]["anonymousLimit"] == 1
            assert stats["admission"]["globalInUse"] == 1, stats["admission"]
            stages = [(await http.get(f"/api/jobs/{j}")).json()["stage"] for j in job_ids]
            assert stages.count("running") == 1 and stages.count("queued") == 19, stages
            in_flight = await asyncio.to_thread(lambda: sum(s.stats().in_flight for s in spaces))
            assert in_flight == 1
        finally:
            await cancel_all(http, job_ids)


# -- per-user bounds, across two workers ----------------------------------------------------


@pytest.fixture(scope="module")
def capped(
    start_service: ServiceFactory, tmp_path_factory: pytest.TempPathFactory
) -> tuple[ServiceProcess, ServiceProcess]:
    """Two service processes over one SQLite coordinator file: 3 sessions, 2 jobs a user."""
    store = tmp_path_factory.mktemp("shared") / "coordinator.db"
    env = {"POOL_COORDINATOR_URL": f"sqlite:///{store}", "POOL_MAX_SESSIONS_PER_USER": "3",
           "POOL_MAX_QUEUED_JOBS_PER_USER": "2", "POOL_JOB_QUEUE_TIMEOUT_S": "120",
           "POOL_MIN_CONNECTIONS": "1"}  # fmt: skip
    return start_service(**env), start_service(**env)


async def open_session(service: ServiceProcess, **body: str) -> httpx.Response:
    async with service.client() as http:
        return await http.post("/api/sessions", json=body)


async def test_sessions_per_user_are_bounded_across_workers_with_429(
    capped: tuple[ServiceProcess, ServiceProcess], spaces: SpaceFleet
) -> None:
    """Three sessions of one email (opened on either worker), then 429 too_many_sessions
    with Retry-After on both; another email is not affected; a deleted one frees a place.
    Anonymous callers together are one user; 12 concurrent opens get exactly 3 places."""
    a, b = capped
    victim = {"email": "victim@example.com"}
    opened = [await open_session(a, **victim), await open_session(b, **victim),
              await open_session(a, **victim)]  # fmt: skip
    assert all(r.status_code == 201 for r in opened), [r.text for r in opened]
    for worker in (a, b):
        assert_429(await open_session(worker, **victim), "too_many_sessions", 3)
    assert (await open_session(b, email="other@example.com")).status_code == 201
    first = opened[0].json()["session"]
    async with b.client() as http:
        gone = await http.delete(f"/api/sessions/{first}", params=victim)
        assert gone.status_code == 204
    assert (await open_session(a, **victim)).status_code == 201
    assert_429(await open_session(b, **victim), "too_many_sessions", 3)

    burst = await asyncio.gather(*(open_session((a, b)[i % 2]) for i in range(12)))
    codes = sorted(r.status_code for r in burst)
    assert codes == [201] * 3 + [429] * 9, [r.text for r in burst]
    assert {r.json()["error"] for r in burst if r.status_code == 429} == {"too_many_sessions"}


async def test_jobs_not_yet_final_per_user_are_bounded_across_workers_with_429(
    capped: tuple[ServiceProcess, ServiceProcess], spaces: SpaceFleet
) -> None:
    """Two unfinished jobs of one email (one per worker), then 429 too_many_jobs with
    Retry-After on both; another email still submits; once one ends, a place is free.
    Anonymous callers together are one user."""
    a, b = capped
    victim = "victim@example.com"
    job_ids: list[str] = []
    async with a.client() as on_a, b.client() as on_b:
        try:
            for http in (on_a, on_b):
                created = await http.post("/api/jobs", json=echo("v", SLOW_S, email=victim))
                assert created.status_code == 202, created.text
                job_ids.append(created.json()["job_id"])
            for http in (on_a, on_b):
                refused = await http.post("/api/jobs", json=echo("v", 0.0, email=victim))
                assert_429(refused, "too_many_jobs", 2)
            other = await on_b.post("/api/jobs", json=echo("o", SLOW_S, email="o@example.com"))
            assert other.status_code == 202, other.text
            job_ids.append(other.json()["job_id"])
            ended = await on_b.delete(f"/api/jobs/{job_ids[0]}")  # a's job, from b
            assert ended.json()["stage"] == "cancelled"

            async def place_free() -> bool:
                created = await on_a.post("/api/jobs", json=echo("v", SLOW_S, email=victim))
                if created.status_code == 202:
                    job_ids.append(created.json()["job_id"])
                    return True
                assert_429(created, "too_many_jobs", 2)
                return False

            await eventually(place_free, 10, "a place after the job ended", every_s=0.2)

            for _ in range(2):
                created = await on_a.post("/api/jobs", json=echo("n", SLOW_S))
                assert created.status_code == 202, created.text
                job_ids.append(created.json()["job_id"])
            assert_429(await on_b.post("/api/jobs", json=echo("n", 0.0)), "too_many_jobs", 2)
        finally:
            await cancel_all(on_a, job_ids)


# -- the counting on its own ----------------------------------------------------------------


class LateWall(Clock):
    """Real time, but the wall clock (sessions' ``used``/``indexed``) can be moved on."""

    def __init__(self) -> None:
        self.offset = 0.0

    def wall(self) -> float:
        return time.time() + self.offset


async def test_the_library_counts_sessions_per_user_and_a_call_keeps_the_count(
    spaces: SpaceFleet, make_pool: PoolMaker, tmp_path: Path
) -> None:
    """Pool.open_session(limit=1): a second session of the same email (or of anonymous
    callers) is UserLimitReached, another email's is not; a session called after an
    idle time's worth re-writes its count (here deleted first), and close() frees it."""
    clock = LateWall()
    pool = make_pool(spaces, clock=clock, coordinator_url=f"sqlite:///{tmp_path / 'c.db'}",
                     session_idle_s=60.0, min_connections=1)  # fmt: skip
    await pool.start()
    mine = await pool.open_session("me@example.com", "alpha", limit=1)
    with pytest.raises(UserLimitReached) as refused:
        await pool.open_session("ME@example.com ", "alpha", limit=1)  # the same user
    assert refused.value.reason == "too_many_sessions" and refused.value.limit == 1
    assert 1.0 <= refused.value.retry_after_s <= 60.0
    await pool.open_session("you@example.com", "alpha", limit=1)
    await pool.open_session(None, "alpha", limit=1)
    with pytest.raises(UserLimitReached):
        await pool.open_session(None, "beta", limit=1)

    me = pool.hash_user("me@example.com")
    await pool.coordinator.values.delete("sessions-held:" + (me or ""))  # as if expired
    clock.offset += 60.0
    done = await pool.predict("/echo", "x", 0, email="me@example.com", session=mine)
    assert done.result == "alpha:x"
    assert len(await pool.sessions.held.held(me)) == 1
    with pytest.raises(UserLimitReached):
        await pool.open_session("me@example.com", "alpha", limit=1)
    await pool.sessions.close(mine, "me@example.com")
    assert await pool.sessions.held.held(me) == {}
    await pool.open_session("me@example.com", "alpha", limit=1)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def holdings(clock: FakeClock) -> tuple[Holdings, MemoryValues]:
    values = MemoryValues()
    held = Holdings(lambda: values, "things-held:", what="things", ttl_s=3600,
                    grace_s=30, clock=clock)  # fmt: skip
    return held, values


async def test_a_refusal_first_drops_the_members_that_ended() -> None:
    """At the limit, members past the grace are asked about: ended ones make room; live
    ones give the Retry-After (the shortest), and the refusal takes nothing."""
    clock = FakeClock()
    held, _ = holdings(clock)
    lasts: dict[str, float | None] = {"a": 40.0, "b": math.inf}

    async def alive(member: str) -> float | None:
        return lasts.get(member)

    await held.take("u", "a", 2, alive)
    await held.take("u", "b", 2, alive)
    await held.take("v", "a", 2, alive)  # another user: counted apart
    clock.now += 31
    with pytest.raises(UserLimitReached) as refused:
        await held.take("u", "c", 2, alive)
    assert refused.value.reason == "too_many_things" and refused.value.limit == 2
    assert refused.value.retry_after_s == 40.0
    assert set(await held.held("u")) == {"a", "b"}
    lasts["a"] = None  # ended without a drop (its worker died, it expired)
    await held.take("u", "c", 2, alive)
    assert set(await held.held("u")) == {"b", "c"}
    await held.drop("u", "b")
    await held.take("u", "d", 2, alive)
    assert set(await held.held("u")) == {"c", "d"}


async def test_members_within_the_grace_count_without_being_asked() -> None:
    """A member taken a moment ago (its record not written yet) is not asked about: it
    counts; an anonymous caller is one user; keep() adds past the limit; None: no limit."""
    clock = FakeClock()
    held, _ = holdings(clock)
    asked: list[str] = []

    async def gone(member: str) -> float | None:
        asked.append(member)
        return None

    await held.take(None, "x", 1, gone)
    with pytest.raises(UserLimitReached) as refused:
        await held.take(None, "y", 1, gone)
    assert asked == [] and refused.value.retry_after_s == 10.0  # nothing says how long
    await held.keep(None, "z")
    assert set(await held.held(None)) == {"x", "z"}
    for n in range(5):
        await held.take("w", f"m{n}", None, gone)
    assert len(await held.held("w")) == 5
