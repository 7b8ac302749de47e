"""The HTTP endpoints (SPEC 5), written the way a user's own handlers would use the pool.

Handlers do the happy path only: ``get_pool().predict(...)`` (admission, retries,
failover, deadline) or ``get_pool().client(...)``. Every
failure is an exception that :mod:`app.core._errors` answers, so no handler builds an error
response itself. A handler fills in the request's log context (Space, queued time,
hashed user) for the one access-log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable
from typing import Any, cast

from fastapi import APIRouter, Depends, Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from pool import Pool, UnknownSpace, get_pool
from pool._consumer import current as current_consumer

from ..admin import Readiness
from ..calls import CheckedCall, identity_headers, read_call
from ..core import IdempotencyKeyInUse, JobNotFound, bounded, context_of, settings_of
from ..core import metrics as _metrics
from ..edge import (
    ERROR_RESPONSES,
    FINAL_STAGES,
    Boundary,
    ErrorBody,
    FileOutput,
    FileStore,
    JobCreated,
    JobView,
    PredictRequest,
    PredictResponse,
    Stage,
    is_admin,
    pass_gate,
    require_admin_token,
    require_api_token,
    to_jsonable,
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
from ._streaming import KEEPALIVE_S, open_stream, wants_stream

_log = logging.getLogger("spacepool.app")

_ERRORS = ERROR_RESPONSES

router = APIRouter()
api = APIRouter(dependencies=[Depends(require_api_token)])
admin = APIRouter(dependencies=[Depends(require_admin_token)])


def _runner(request: Request) -> JobRunner:
    runner: JobRunner = request.app.state.jobs
    return runner


def _prepare(request: Request, body: PredictRequest) -> Pool:
    """The pool, after the checks the pool would answer less precisely."""
    pool = get_pool()
    if body.space is not None and body.space not in pool.spaces:
        raise UnknownSpace(body.space, sorted(pool.spaces))
    context_of(request).user = pool.hash_user(body.email)
    return pool


def file_output(request: Request, body: PredictRequest) -> FileOutput:
    """How this request's output files are rendered (URL, or inline when small)."""
    store: FileStore = request.app.state.files
    limit = settings_of(request).file_inline_max_bytes
    return FileOutput(store, body.files, limit)


async def _read(request: Request) -> CheckedCall:
    """The body (JSON or multipart), checked by ``_prepare``, then its files on disk."""
    settings = settings_of(request)
    boundary: Boundary = request.app.state.boundary
    call = await read_call(request, settings, boundary, lambda body: _prepare(request, body))
    call.headers = identity_headers(request, settings)
    return call


# The body is read by app.calls._inputs (JSON, or multipart with files): described here.
_BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": PredictRequest.model_json_schema()},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["body"],
                    "properties": {
                        "body": {
                            **PredictRequest.model_json_schema(),
                            "description": "the JSON body; file arguments refer to parts"
                            ' as {"file": {"upload": "<part name>"}}',
                        }
                    },
                    "additionalProperties": {"type": "string", "format": "binary"},
                },
                "encoding": {"body": {"contentType": "application/json"}},
            },
        },
    }
}


@router.get("/healthz", tags=["service"])
async def healthz() -> dict[str, str]:
    """Liveness: the process answers. Does not contact any Space (``/readyz`` does)."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    tags=["service"],
    responses={503: {"description": "not ready: the coordinator or an app's every Space"}},
)
async def readyz(request: Request) -> JSONResponse:
    """Readiness: the admission store answers and every app has a Space up or wakeable
    (app/admin/_readiness.py). 503 otherwise, saying what failed."""
    readiness: Readiness = request.app.state.readiness
    ready, body = await readiness.check(get_pool())
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/", tags=["service"], include_in_schema=False)
async def index() -> dict[str, Any]:
    """Where to go from here."""
    return {
        "service": "spacepool",
        "docs": "/docs",
        "endpoints": [
            "/api/predict",
            "/api/jobs",
            "/api/spaces",
            "/api/sessions",
            "/api/admin/pool-stats",
            "/metrics",
        ],
    }


@api.post(
    "/api/predict",
    response_model=PredictResponse,
    responses={
        200: {
            "content": {"application/json": {}, "text/event-stream": {}},
            "description": "the result; with stream: true (or Accept: text/event-stream)"
            " Server-Sent Events, one per partial output, then the result",
        },
        **_ERRORS,
    },
    tags=["predict"],
    openapi_extra=_BODY_DOC,
)
async def predict(request: Request) -> PredictResponse | Response:
    """Run one predict on a pooled connection and return its result (or stream it).

    JSON, or multipart with file parts (``{"file": {"upload": ...}}`` arguments);
    output files come back as ``{"file": {"url": "/api/files/...", ...}}``. With
    ``"stream": true`` (or ``Accept: text/event-stream``): Server-Sent Events, one per
    partial output, then the result.
    """
    settings = settings_of(request)
    call = await _read(request)
    body = call.body
    files = file_output(request, body)
    if wants_stream(body, request):
        return await open_stream(get_pool(), call, request, settings, files)  # owns call
    try:
        pool = get_pool()
        ctx = context_of(request)

        async def admitted(space: str) -> None:
            ctx.space = space
            await pass_gate(space)

        done = await call.predict(
            pool,
            timeout=body.timeout_s or settings.predict_timeout_s,
            on_admitted=admitted,
            download_to=files.store.partial,
        )
    finally:
        call.cleanup()
    ctx.space, ctx.queued_ms = done.space, done.queued_ms
    return PredictResponse(
        space=done.space,
        result=to_jsonable(done.result, files.render),
        queued_ms=done.queued_ms,
        duration_ms=done.duration_ms,
        attempts=done.attempts,
    )


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


@api.post(
    "/api/jobs",
    status_code=202,
    response_model=JobCreated,
    responses=_JOB_ERRORS,
    tags=["jobs"],
    openapi_extra=_BODY_DOC,
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
    call = await _read(request)
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


@api.get("/api/jobs/{job_id}", response_model=JobView, responses=_ERRORS, tags=["jobs"])
async def get_job(job_id: str, request: Request) -> JSONResponse:
    """The job's stage, and its result or error once it has one."""
    record = await _own_job(request, _runner(request), job_id)
    context_of(request).space = record.space
    return JSONResponse(record.view())


@api.delete("/api/jobs/{job_id}", response_model=JobView, responses=_ERRORS, tags=["jobs"])
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


@api.get(
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


@admin.get("/api/admin/pool-stats", responses=_ERRORS, tags=["admin"])
async def pool_stats(request: Request) -> dict[str, Any]:
    """The pool's statistics (SPEC 5 keys, plus admission and the dashboard's activity)."""
    pool = get_pool()
    stats: dict[str, Any] = await pool.stats()
    activity = getattr(request.app.state, "activity", None)
    if activity is not None:  # app.admin._history: requests per minute, errors, queue history
        await activity.extend(stats, pool.coordinator if stats.get("initialized") else None)
    return stats


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text"}},
    tags=["service"],
)
async def metrics(request: Request) -> Response:
    """Prometheus exposition: hook-fed counters plus gauges read from pool stats now."""
    try:
        stats: dict[str, Any] = await get_pool().stats()
    except Exception:
        _log.warning("pool stats unavailable for /metrics", exc_info=True)
        stats = {}
    jobs = await _runner(request).store.counts()
    text = _metrics.render(stats, jobs, teams=is_admin(request))  # per-key: the admin's
    return Response(text, media_type=_metrics.CONTENT_TYPE)


router.include_router(api)
router.include_router(admin)
