"""``Idempotency-Key`` on ``POST /api/jobs`` (issue 28, finding 6): a key is kept only
for a submission that was accepted, it is bound to the request it came with, and a
second request while the first is still being created is told to wait (409). Real
uvicorn services over the stand-in Spaces; the reservation itself on a memory store."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core._errors import IdempotencyKeyReused
from app.edge._schemas import PredictRequest
from app.jobs._idempotency import (
    CREATING_TTL_S,
    accept,
    caller_of,
    fingerprint,
    release,
    reserve,
)
from devspaces import SpaceFleet
from pool.admission import open_coordinator
from pool.admission._values import MemoryValues
from tests.service.conftest import ServiceFactory, ServiceProcess, eventually

RETENTION_S = 3600.0


@pytest.fixture(scope="module")
def service(start_service: ServiceFactory) -> ServiceProcess:
    """A service with the default job bound."""
    return start_service()


@pytest.fixture(scope="module")
def one_job(start_service: ServiceFactory) -> ServiceProcess:
    """A service that keeps one job at a time (POOL_JOB_MAX=1)."""
    return start_service(POOL_JOB_MAX="1")


def echo(text: str, delay_s: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {"api_name": "/echo", "args": [text, delay_s], **extra}


async def stage_of(client: httpx.AsyncClient, job_id: str) -> str | None:
    response = await client.get(f"/api/jobs/{job_id}")
    if response.status_code == 404:
        return None
    assert response.status_code == 200, response.text
    stage: str = response.json()["stage"]
    return stage


async def until_stage(client: httpx.AsyncClient, job_id: str, wanted: str) -> None:
    async def reached() -> bool:
        return await stage_of(client, job_id) == wanted

    await eventually(reached, 30, f"job {job_id} {wanted}")


# -- over HTTP -------------------------------------------------------------------------------


async def test_a_refused_submission_keeps_no_key_and_its_retry_creates_the_job(
    one_job: ServiceProcess, spaces: SpaceFleet
) -> None:
    """503 jobs_full with a key, capacity freed, the same key again: 202, a new job that
    exists and runs to done, not a replay of the refused one."""
    key = {"Idempotency-Key": "full-then-free-1"}
    async with one_job.client() as client:
        blocker = await client.post("/api/jobs", json=echo("blocker", 60.0, timeout_s=120))
        assert blocker.status_code == 202, blocker.text
        blocker_id = blocker.json()["job_id"]

        refused = await client.post("/api/jobs", json=echo("keyed"), headers=key)
        assert refused.status_code == 503, refused.text
        assert refused.json()["reason"] == "jobs_full"

        assert (await client.delete(f"/api/jobs/{blocker_id}")).status_code == 200
        retried = await client.post("/api/jobs", json=echo("keyed"), headers=key)
        assert retried.status_code == 202, retried.text
        assert "Idempotent-Replayed" not in retried.headers
        job_id = retried.json()["job_id"]
        assert await stage_of(client, job_id) is not None  # not a 404
        await until_stage(client, job_id, "done")
        result = (await client.get(f"/api/jobs/{job_id}")).json()["result"]
        assert result.endswith(":keyed")

        # From now on the key names that job.
        again = await client.post("/api/jobs", json=echo("keyed"), headers=key)
        assert again.status_code == 202 and again.json()["job_id"] == job_id
        assert again.headers.get("Idempotent-Replayed") == "true"


async def test_an_invalid_body_keeps_no_key(service: ServiceProcess, spaces: SpaceFleet) -> None:
    """A submission refused by validation (422) reserves nothing: the same key with a
    good body then creates its job."""
    key = {"Idempotency-Key": "invalid-first"}
    async with service.client() as client:
        bad = await client.post("/api/jobs", json={"api_name": "/echo", "nope": 1}, headers=key)
        assert bad.status_code == 422 and bad.json()["error"] == "invalid_body"
        unknown = await client.post("/api/jobs", json=echo("x", space="no-such"), headers=key)
        assert unknown.status_code == 422 and unknown.json()["error"] == "unknown_space"
        good = await client.post("/api/jobs", json=echo("x"), headers=key)
        assert good.status_code == 202, good.text
        assert "Idempotent-Replayed" not in good.headers
        await until_stage(client, good.json()["job_id"], "done")


async def test_the_same_key_with_another_body_is_422(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """Same key, different body: 422 idempotency_key_reused, and no second job."""
    key = {"Idempotency-Key": "reused-key-1"}
    async with service.client() as client:
        first = await client.post("/api/jobs", json=echo("first"), headers=key)
        assert first.status_code == 202, first.text
        other = await client.post("/api/jobs", json=echo("second"), headers=key)
        assert other.status_code == 422, other.text
        body = other.json()
        assert body["error"] == "idempotency_key_reused"
        assert "Idempotency-Key" in body["message"]
        assert "job_id" not in body and "first" not in body["message"]
        # Another email is another caller: the key is theirs to use.
        theirs_body = echo("second", email="b@example.com")
        theirs = await client.post("/api/jobs", json=theirs_body, headers=key)
        assert theirs.status_code == 202 and theirs.json()["job_id"] != first.json()["job_id"]
        await until_stage(client, first.json()["job_id"], "done")
        await until_stage(client, theirs.json()["job_id"], "done")
    assert sum(space.stats().total for space in spaces) == 2


async def test_the_same_key_with_the_same_body_replays_the_job(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """Same key, same body (keys in another order): the first job's id, replayed."""
    key = {"Idempotency-Key": "replay-key-1"}
    async with service.client() as client:
        first = await client.post("/api/jobs", json=echo("once", 0.5), headers=key)
        assert first.status_code == 202 and "Idempotent-Replayed" not in first.headers
        job_id = first.json()["job_id"]
        reordered = {"args": ["once", 0.5], "api_name": "/echo"}
        for body in (echo("once", 0.5), reordered):
            again = await client.post("/api/jobs", json=body, headers=key)
            assert again.status_code == 202, again.text
            assert again.json()["job_id"] == job_id
            assert again.headers["Idempotent-Replayed"] == "true"
            assert again.headers["Location"] == f"/api/jobs/{job_id}"
        await until_stage(client, job_id, "done")
    assert sum(space.stats().total for space in spaces) == 1


async def test_multipart_files_are_part_of_the_fingerprint(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """The same multipart body with other bytes in its file part is another request (422);
    with the same bytes, a replay."""
    key = {"Idempotency-Key": "multipart-key-1"}
    body = '{"api_name": "/echo", "args": [{"file": {"upload": "doc"}}, 0.0]}'

    def parts(content: bytes) -> dict[str, Any]:
        return {"data": {"body": body}, "files": {"doc": ("a.txt", content, "text/plain")}}

    async with service.client() as client:
        first = await client.post("/api/jobs", headers=key, **parts(b"one"))
        assert first.status_code == 202, first.text
        same = await client.post("/api/jobs", headers=key, **parts(b"one"))
        assert same.status_code == 202 and same.json()["job_id"] == first.json()["job_id"]
        assert same.headers["Idempotent-Replayed"] == "true"
        other = await client.post("/api/jobs", headers=key, **parts(b"two"))
        assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"


async def test_a_key_still_being_created_on_another_worker_is_409(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """While another worker holds the key's reservation (not yet accepted): 409
    idempotency_key_in_use with Retry-After 1; once it gives the key up, the retry
    creates the job."""
    db = service.log_path.parent / "coordinator.db"
    key = {"Idempotency-Key": "in-flight-key"}
    other_worker = open_coordinator(f"sqlite:///{db}")
    try:
        values = other_worker.values
        caller = caller_of("", None)  # no token, no email
        body = echo("contended")
        body_fp = fingerprint(PredictRequest.model_validate(body))
        held = await reserve(values, caller, "in-flight-key", "job-of-the-other-worker", body_fp)
        assert held.mine
        async with service.client() as client:
            busy = await client.post("/api/jobs", json=body, headers=key)
            assert busy.status_code == 409, busy.text
            assert busy.json()["error"] == "idempotency_key_in_use"
            assert busy.headers["Retry-After"] == "1"
            await release(values, held)  # the other worker's submission was refused
            retried = await client.post("/api/jobs", json=body, headers=key)
            assert retried.status_code == 202, retried.text
            assert "Idempotent-Replayed" not in retried.headers
            await until_stage(client, retried.json()["job_id"], "done")
    finally:
        await other_worker.aclose()


# -- the reservation, on its own -------------------------------------------------------------


def fp(text: str, files: tuple[str, ...] = ()) -> str:
    return fingerprint(PredictRequest.model_validate(echo(text)), files)


async def test_a_second_reserve_sees_the_first_in_creation_then_accepted() -> None:
    """The first reserve holds the key (creating); a second, same body, sees it still in
    creation; after accept, it sees the accepted job; another body is refused either way."""
    values = MemoryValues()
    first = await reserve(values, "c", "k", "job-1", fp("a"))
    assert first.mine and first.job_id == "job-1" and not first.accepted
    second = await reserve(values, "c", "k", "job-2", fp("a"))
    assert (second.mine, second.job_id, second.accepted) == (False, "job-1", False)
    with pytest.raises(IdempotencyKeyReused):
        await reserve(values, "c", "k", "job-3", fp("b"))
    assert await accept(values, first, RETENTION_S)
    third = await reserve(values, "c", "k", "job-4", fp("a"))
    assert (third.mine, third.job_id, third.accepted) == (False, "job-1", True)
    with pytest.raises(IdempotencyKeyReused):
        await reserve(values, "c", "k", "job-5", fp("b"))
    # Another caller, or another key, is another entry.
    assert (await reserve(values, "d", "k", "job-6", fp("b"))).mine
    assert (await reserve(values, "c", "k2", "job-7", fp("b"))).mine


async def test_release_frees_the_key_and_only_its_own_reservation() -> None:
    """A released key is free for the next request; releasing a reservation that is no
    longer the holder's (taken by another request, or accepted) leaves the entry alone."""
    values = MemoryValues()
    first = await reserve(values, "c", "k", "job-1", fp("a"))
    await release(values, first)
    second = await reserve(values, "c", "k", "job-2", fp("a"))
    assert second.mine and second.job_id == "job-2"
    await release(values, first)  # not first's any more: nothing happens
    assert not await accept(values, first, RETENTION_S)
    assert not (await reserve(values, "c", "k", "job-3", fp("a"))).mine
    assert await accept(values, second, RETENTION_S)
    await release(values, second)  # accepted: the key stays with its job
    replayed = await reserve(values, "c", "k", "job-4", fp("a"))
    assert (replayed.mine, replayed.job_id, replayed.accepted) == (False, "job-2", True)


async def test_a_reservation_nobody_finishes_expires_and_an_accepted_one_is_kept() -> None:
    """A worker that dies between reserve and accept holds the key for CREATING_TTL_S,
    not for the retention; an accepted key lasts the retention."""
    clock = FakeClock()
    values = MemoryValues(clock=clock)
    await reserve(values, "c", "k", "job-1", fp("a"))
    clock.now += CREATING_TTL_S + 0.1
    second = await reserve(values, "c", "k", "job-2", fp("a"))
    assert second.mine
    assert await accept(values, second, RETENTION_S)
    clock.now += RETENTION_S - 1
    assert (await reserve(values, "c", "k", "job-3", fp("a"))).job_id == "job-2"
    clock.now += 2
    assert (await reserve(values, "c", "k", "job-4", fp("a"))).mine


async def test_concurrent_reserves_give_the_key_to_exactly_one() -> None:
    """Ten reserves of one key at once: one holds it, nine see its job in creation."""
    values = MemoryValues()
    held = await asyncio.gather(
        *(reserve(values, "c", "k", f"job-{i}", fp("a")) for i in range(10))
    )
    assert sum(h.mine for h in held) == 1
    assert len({h.job_id for h in held}) == 1
    assert not any(h.accepted for h in held)


async def test_two_workers_reserving_one_key_at_once_agree(tmp_path: Path) -> None:
    """Two coordinators on one SQLite file (two workers), reserving one key 5 times each
    at once: one reservation holds it, every other names that reservation's job."""
    workers = [open_coordinator(f"sqlite:///{tmp_path / 'shared.db'}") for _ in range(2)]
    try:
        held = await asyncio.gather(
            *(reserve(workers[i % 2].values, "c", "k", f"job-{i}", fp("a")) for i in range(10))
        )
    finally:
        for worker in workers:
            await worker.aclose()
    assert sum(h.mine for h in held) == 1
    assert {h.job_id for h in held} == {next(h.job_id for h in held if h.mine)}


async def test_an_entry_from_before_fingerprints_is_replayed() -> None:
    """An entry written by the previous version (the job id alone) names an accepted job."""
    values = MemoryValues()
    first = await reserve(values, "c", "k", "job-1", fp("a"))
    await values.put(first.name, "old-job-id", RETENTION_S)
    held = await reserve(values, "c", "k", "job-2", fp("b"))
    assert (held.mine, held.job_id, held.accepted) == (False, "old-job-id", True)


def test_the_fingerprint_is_the_validated_body_and_the_uploaded_bytes() -> None:
    """Key order and defaults left out do not change it; a value or a file's bytes do."""
    sent = PredictRequest.model_validate({"args": ["a", 0.0], "api_name": "/echo"})
    full = PredictRequest.model_validate({**echo("a"), "kwargs": {}, "priority": "interactive"})
    assert fingerprint(sent) == fingerprint(full) == fp("a")
    assert fp("a") != fp("b")
    assert fp("a", ("d1",)) not in {fp("a"), fp("a", ("d2",)), fp("a", ("d1", "d1"))}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now
