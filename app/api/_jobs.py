"""The jobs: ``POST /api/jobs`` starts a predict in the background (an
``Idempotency-Key`` makes a retried submission get the first one's job), ``GET`` and
``DELETE /api/jobs/{id}`` read and cancel it, ``/api/jobs/{id}/events`` follows it as
Server-Sent Events. A caller sees its own key's jobs only; the admin token sees all."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable
from typing import Any, cast

from fastapi import APIRouter, Depends, Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from pool import get_pool
from pool.admission import current as current_consumer

from ..calls import BODY_DOC, CheckedCall, file_output, read_checked
from ..core import (
    KEEPALIVE_S,
    IdempotencyKeyInUse,
    JobNotFound,
    bounded,
    context_of,
    services_of,
    settings_of,
)
from ..edge import (
    ERROR_RESPONSES,
    FINAL_STAGES,
    ErrorBody,
    JobCreated,
    JobView,
    Stage,
    is_admin,
    require_api_token,
)
from ..jobs import (
    MAX_KEY_CHARS,
    Held,
    JobRecord,
    JobRunner,
    accept,
    caller_of,
    fingerprint_call,
    release,
    reserve,
)

_log = logging.getLogger("spacepool.app")

router = APIRouter(dependencies=[Depends(require_api_token)])
_ERRORS = ERROR_RESPONSES


def _runner(request: Request) -> JobRunner:
    return services_of(request).get(JobRunner)


_JOB_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    409: {
        "model": ErrorBody,
        "description": "a request with this Idempotency-Key is still creating its job"
        " (idempotency_key_in_use, Retry-After)",
    },
    422: {
        **ERROR_RESPONSES[422],
        "description": f"{ERROR_RESPONSES[422]['description']}; an Idempotency-Key sent"
        " before with another body (idempotency_key_reused)",
    },
}


@router.post(
    "/api/jobs",
    status_code=202,
    response_model=JobCreated,
    responses=_JOB_ERRORS,
    tags=["jobs"],
    openapi_extra=BODY_DOC,
)
async def create_job(
    request: Request,
    response: Response,
    idempotency_key: str | None = Header(
        default=None,
        min_length=1,
        max_length=MAX_KEY_CHARS,
        description="a retry with the same key (and caller) and the same body within the"
        " retention time returns the first request's job instead of starting another",
    ),
) -> JobCreated:
    """Start a predict in the background; follow it with GET or its SSE events.

    The same bodies as ``/api/predict``; uploaded files live until the job ends. With an
    ``Idempotency-Key`` header, a retried submission gets the first one's job.
    """
    call = await read_checked(request)
    runner = _runner(request)
    job_id = secrets.token_urlsafe(16)
    try:
        held = await _reserve(request, call, job_id, idempotency_key)
    except BaseException:
        call.cleanup()
        raise
    if held is not None and not held.mine:  # a retry: the job of the first request
        call.cleanup()
        known = await runner.store.get(held.job_id)
        if known is None and not held.accepted:
            raise IdempotencyKeyInUse(
                "a request with this Idempotency-Key is still creating its job; retry in a moment"
            )
        response.headers["Idempotent-Replayed"] = "true"
        context_of(request).made_no_call = True  # its quota's call was the first's
        stage = cast(Stage, known.stage) if known is not None else "queued"
        return _created(response, held.job_id, stage)
    try:
        record = await runner.submit(
            call.body, call, file_output(request, call.body), job_id=job_id
        )
    except BaseException:
        call.cleanup()
        if held is not None:  # refused: the key is not kept, a retry creates the job
            await _settle(release(get_pool().coordinator.values, held), "release")
        raise
    if held is not None:
        ttl = settings_of(request).job_retention_s
        await _settle(accept(get_pool().coordinator.values, held, ttl), "accept")
    return _created(response, job_id, cast(Stage, record.stage))


def _created(response: Response, job_id: str, stage: Stage) -> JobCreated:
    url = f"/api/jobs/{job_id}"
    response.headers["Location"] = url
    return JobCreated(job_id=job_id, stage=stage, url=url, events_url=f"{url}/events")


async def _reserve(
    request: Request, call: CheckedCall, job_id: str, key: str | None
) -> Held | None:
    """The key's entry, reserved for ``job_id`` if the key is new (None without a key)."""
    if key is None:
        return None
    pool = get_pool()
    caller = caller_of(request.headers.get("authorization", ""), pool.hash_user(call.body.email))
    return await reserve(pool.coordinator.values, caller, key, job_id, await fingerprint_call(call))


async def _settle(change: Awaitable[object], what: str) -> None:
    """Finish a change of the key's entry, shielded from the request's cancellation.

    A store that fails here only delays the key: an entry left ``creating`` expires
    after ``CREATING_TTL_S``, and meanwhile a retry finds the job if it exists. The
    request's own answer (its job, or the error that refused it) stands.
    """
    try:
        if await asyncio.shield(change) is False:
            _log.warning("Idempotency-Key reservation expired before its job was created")
    except Exception as exc:
        _log.warning("could not %s an Idempotency-Key (%s)", what, type(exc).__name__)


async def _own_job(request: Request, runner: JobRunner, job_id: str) -> JobRecord:
    """The job, if the caller's key made it (JobNotFound otherwise, as for an unknown
    id: another team's job is not there for them, issue 38); the admin token sees all."""
    record = await runner.store.get(job_id)
    consumer = current_consumer()
    if record is None or (
        record.team != (None if consumer is None else consumer.key_id) and not is_admin(request)
    ):
        raise JobNotFound(f"no job {job_id[:64]!r} here (unknown or expired)")
    return record


@router.get("/api/jobs/{job_id}", response_model=JobView, responses=_ERRORS, tags=["jobs"])
async def get_job(job_id: str, request: Request) -> JSONResponse:
    """The job's stage, and its result or error once it has one."""
    record = await _own_job(request, _runner(request), job_id)
    context_of(request).space = record.space
    return JSONResponse(record.view())


@router.delete("/api/jobs/{job_id}", response_model=JobView, responses=_ERRORS, tags=["jobs"])
async def cancel_job(job_id: str, request: Request) -> JSONResponse:
    """Cancel the job, upstream too; its slot is free when this returns.

    A job that already finished is left as it is (the answer shows its final stage).
    """
    runner = _runner(request)
    await _own_job(request, runner, job_id)
    record = await runner.cancel(job_id)
    if record is None:
        raise JobNotFound(f"no job {job_id[:64]!r} here (unknown or expired)")
    return JSONResponse(record.view())


@router.get(
    "/api/jobs/{job_id}/events",
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "one event per change"},
        **_ERRORS,
    },
    response_class=StreamingResponse,
    tags=["jobs"],
)
async def job_events(
    job_id: str,
    request: Request,
    last_event_id: str | None = Header(default=None, max_length=32),
) -> StreamingResponse:
    """Server-Sent Events: the job's JSON at every change; ends after a final stage."""
    runner = _runner(request)
    await _own_job(request, runner, job_id)
    after: int | None = None
    if last_event_id is not None and last_event_id.strip().isdigit():
        after = int(last_event_id.strip())
    return StreamingResponse(
        bounded(request, None, _event_stream(runner, job_id, after)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _sse(view: dict[str, Any]) -> bytes:
    return f"id: {view['version']}\ndata: {json.dumps(view)}\n\n".encode()


async def _event_stream(runner: JobRunner, job_id: str, after: int | None) -> AsyncIterator[bytes]:
    yield b"retry: 2000\n\n"
    store = runner.store
    record = await store.get(job_id)
    if record is None:
        return
    if after is None or after > record.version:
        yield _sse(record.view())
        after = record.version
    # A client resuming behind the current version first gets what it missed.
    final = record.final and after >= record.version
    while not final:
        views = await store.changes(job_id, after, timeout=KEEPALIVE_S)
        if views is None:
            return
        if not views:
            yield b": keepalive\n\n"
            continue
        for view in views:
            yield _sse(view)
            after = int(view["version"])
            final = view["stage"] in FINAL_STAGES
