"""``POST /api/predict`` (SPEC 5): one call, answered whole or as Server-Sent Events,
written the way a user's own handler would use the pool.

The handler does the happy path only: ``get_pool().predict(...)`` (admission, retries,
failover, deadline). Every
failure is an exception that :mod:`app.core._errors` answers, so no handler builds an error
response itself. A handler fills in the request's log context (Space, queued time,
hashed user) for the one access-log line.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from pool import get_pool

from ..calls import BODY_DOC, file_output, read_checked
from ..core import context_of, settings_of
from ..edge import ERROR_RESPONSES, PredictResponse, pass_gate, require_api_token, to_jsonable
from ._streaming import open_stream, wants_stream

router = APIRouter(dependencies=[Depends(require_api_token)])


@router.post(
    "/api/predict",
    response_model=PredictResponse,
    responses={
        200: {
            "content": {"application/json": {}, "text/event-stream": {}},
            "description": "the result; with stream: true (or Accept: text/event-stream)"
            " Server-Sent Events, one per partial output, then the result",
        },
        **ERROR_RESPONSES,
    },
    tags=["predict"],
    openapi_extra=BODY_DOC,
)
async def predict(request: Request) -> PredictResponse | Response:
    """Run one predict on a pooled connection and return its result (or stream it).

    JSON, or multipart with file parts (``{"file": {"upload": ...}}`` arguments);
    output files come back as ``{"file": {"url": "/api/files/...", ...}}``. With
    ``"stream": true`` (or ``Accept: text/event-stream``): Server-Sent Events, one per
    partial output, then the result.
    """
    settings = settings_of(request)
    call = await read_checked(request)
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
