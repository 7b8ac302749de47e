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
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pool import InvalidRequest, get_pool
from pool.transport import apply_diff

from ..core import bounded
from ..edge import BadJson, parse_json
from ._event_request import event_of
from ._fleet import call_key
from ._front_session import FrontSession
from ._front_sessions import FrontSessions
from ._space_view import served


async def call_post(
    request: Request,
    front: FrontSessions,
    scope: str | None,
    email: str | None,
    front_root: str,
) -> Response:
    """``POST call/{api_name}`` of ``email``'s user; its event built as a join's
    (:func:`~app.gradio._event_request.event_of`). Failures are raised (the routes
    answer them)."""
    try:
        body = parse_json(await request.body())
    except BadJson as exc:
        raise InvalidRequest(f"invalid body: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise InvalidRequest('the body must be {"data": [...]}')
    pool = get_pool()
    _, app = await served(pool, scope)
    name = "/" + str(request.path_params["api_name"]).strip("/")
    endpoint = app.endpoint(name) if name in app.api_names() else None
    if endpoint is None:
        raise InvalidRequest(f"no endpoint {name!r}; this app has {app.api_names()}")
    data = list(body["data"])
    for position in endpoint.state_inputs:  # prepare_simple_api_data
        data.insert(position, None)
    given = body.get("session_hash")
    session_hash = given if isinstance(given, str) and given else uuid.uuid4().hex
    body = {"fn_index": endpoint.fn_index, "data": data}
    event = await event_of(pool, front.outputs, scope, body, email, front_root)
    session = await front.open(scope, session_hash, event.email)
    event_id = await session.join(event)
    await _remember(front, event_id, session, not isinstance(given, str) or not given)
    return JSONResponse({"event_id": event_id})


async def call_get(request: Request, front: FrontSessions, email: str | None) -> Response:
    """``GET call/{api_name}/{event_id}``: the event's messages in the REST form (its
    own scope and user's only: another's is unknown, issue 38)."""
    event_id = str(request.path_params["event_id"])
    alias = request.path_params.get("alias")
    found = await _recall(front, event_id, email, None if alias is None else str(alias))
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


async def _remember(front: FrontSessions, event_id: str, session: FrontSession, own: bool) -> None:
    """A REST call to be read by ``GET call/…/{event_id}`` on any worker: its session,
    and whether it was made for the call (ended after it)."""
    record = json.dumps({"scope": session.scope, "hash": session.hash, "own": own})
    await front.values().put(call_key(event_id), record, front.shared_ttl_s)


async def _recall(
    front: FrontSessions, event_id: str, email: str | None, scope: str | None
) -> tuple[FrontSession, bool] | None:
    """The session of a REST call not read yet, and whether it was made for the call;
    taken (a call's stream is read once). None: unknown, made under another scope than
    ``scope``, or another identity's."""
    key = call_key(event_id)
    raw = await front.values().get(key)
    try:
        found: dict[str, Any] = json.loads(raw or "null")
        made, session_hash, own = found["scope"], str(found["hash"]), bool(found["own"])
    except (ValueError, KeyError, TypeError):
        return None
    if (None if made is None else str(made)) != scope:
        return None
    session = await front.find(scope, session_hash, email)
    if session is None:
        return None
    await front.values().delete(key)
    return session, own
