"""The REST form of a call (gradio/routes.py ``simple_predict_post``/``_get``):
``POST call/{api_name}`` ``{"data": [...], "session_hash"?}`` → ``{"event_id"}``, then
``GET call/{api_name}/{event_id}``: ``event: generating|complete|error|heartbeat`` with
the outputs as ``data`` (whole, not diffs: ``simple_format``).

An event of this form runs like a ``queue/join`` (the same admission and session
pinning) in a session of its own unless the caller names one; its stream is read by
the GET, once, on any worker (the call's session is found through the coordinator).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pool import InvalidRequest, get_pool
from pool.transport import apply_diff

from ..core import bounded
from ..edge import BadJson, parse_json
from ._front_sessions import EventRequest, FrontSession, FrontSessions
from ._space_view import served


async def call_post(
    request: Request,
    front: FrontSessions,
    scope: str | None,
    event_of: Callable[[Request, dict[str, Any]], Awaitable[EventRequest]],
) -> Response:
    """``POST call/{api_name}``; ``event_of(request, body)`` builds the event as a join's.
    Failures are raised (the routes answer them)."""
    try:
        body = parse_json(await request.body())
    except BadJson as exc:
        raise InvalidRequest(f"invalid body: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise InvalidRequest('the body must be {"data": [...]}')
    _, _, app = await served(get_pool(), scope)
    name = "/" + str(request.path_params["api_name"]).strip("/")
    endpoint = app.endpoint(name) if name in app.api_names() else None
    if endpoint is None:
        raise InvalidRequest(f"no endpoint {name!r}; this app has {app.api_names()}")
    data = list(body["data"])
    for position in endpoint.state_inputs:  # prepare_simple_api_data
        data.insert(position, None)
    given = body.get("session_hash")
    session_hash = given if isinstance(given, str) and given else uuid.uuid4().hex
    event = await event_of(request, {"fn_index": endpoint.fn_index, "data": data})
    session = await front.open(scope, session_hash, event.email)
    event_id = await session.join(event)
    await front.remember_call(event_id, session, not isinstance(given, str) or not given)
    return JSONResponse({"event_id": event_id})


async def call_get(request: Request, front: FrontSessions, email: str | None) -> Response:
    """``GET call/{api_name}/{event_id}``: the event's messages in the REST form (its
    own scope and user's only: another's is unknown, issue 38)."""
    event_id = str(request.path_params["event_id"])
    alias = request.path_params.get("alias")
    found = await front.recall(event_id, email, None if alias is None else str(alias))
    if found is None:
        return JSONResponse({"detail": "Not Found"}, status_code=404)
    session, own = found
    stream = bounded(request, email,  # one of the caller's open streams (429 past the cap)
                     _rest_stream(front, session, str(request.path_params["event_id"]), own))
    return StreamingResponse(stream, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})  # fmt: skip


async def _rest_stream(
    front: FrontSessions, session: FrontSession, event_id: str, own: bool
) -> AsyncIterator[str]:
    outputs: list[Any] | None = None
    try:
        async for item in session.messages():
            if item is None:
                yield "event: heartbeat\ndata: null\n\n"
                continue
            msg, _ = item
            if msg.get("event_id") != event_id:
                continue
            kind, output = msg.get("msg"), msg.get("output") or {}
            success = bool(msg.get("success", True))
            if kind == "process_generating" and success:
                outputs = _whole(outputs, list(output.get("data") or []))
                yield f"event: generating\ndata: {json.dumps(outputs)}\n\n"
            elif kind == "process_completed":
                data = output.get("data") if success else output
                yield f"event: {'complete' if success else 'error'}\ndata: {json.dumps(data)}\n\n"
                return
    finally:
        if own:
            front.end_later(session)


def _whole(previous: list[Any] | None, data: list[Any]) -> list[Any]:
    """Partial outputs after the first are diffs (gradio_client ``stream_sse_v1plus``)."""
    if previous is None:
        return data
    merged = list(previous)
    for i, diff in enumerate(data):
        if i >= len(merged):
            merged.append(None)
        merged[i] = apply_diff(merged[i], diff)
    return merged
