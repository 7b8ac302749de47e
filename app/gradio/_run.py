"""``POST B/gradio_api/run/{api_name}``: the events a Gradio page runs outside its
queue, relayed as pool calls (issue 42).

A page sends an event whose dependency has ``queue=False`` (a ChatInterface's clearing
steps, for one) to ``run/{api_name}`` and reads the outputs from the answer
(@gradio/client ``submit``'s ``skip_queue`` branch, client/js/src/utils/submit.ts;
the Space answers it in gradio/routes.py ``predict``: ``{"data", "is_generating",
"duration", "average_duration", "render_config", "changed_state_ids"}``, or 500 with
``utils.error_payload``'s ``{"error", ...}``). Here it is a call of the pool like every
event of the front: checked as a join is (its function in the served config, the trust
boundary, the secret guard), admitted under the global cap and the caller's, run on
the session's Space in the session's upstream session (so its ``gr.State`` is the
conversation's), counted in the key's quota and usage. It runs through the Space's
queue in that session (a Gradio server takes any event there, ``queue=False`` or not)
and its completion is answered as ``run`` answers. Its output files are made known to
the fleet's trust boundary, as a queued event's are.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from pool import CallAttempt, InvalidRequest, PoolError, get_pool
from pool.transport import AppInfo

from ..core import context_of
from ..edge import pass_gate
from ._event_request import EventRequest
from ._front_session import FrontSession
from ._rewrite import rewriter
from ._routes import _body, _event, _scope, sessions
from ._space_view import app_of, served
from ._visitors import as_visitor

_COMPLETION_WAIT_S = 5.0  # after the job's end, for its completion message


async def run(request: Request) -> Response:
    """``run/{api_name}`` as a Space answers it, the event a pool call."""
    body = await _body(request)
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    pool = get_pool()
    if not isinstance(body.get("fn_index"), int):  # by name, as routes.py ``get_fn``
        _, served_app = await served(pool, _scope(request))
        try:
            body["fn_index"] = served_app.endpoint(str(request.path_params["api_name"])).fn_index
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
    session_hash = body.get("session_hash")
    if not isinstance(session_hash, str) or not session_hash:
        session_hash = body["session_hash"] = uuid.uuid4().hex  # a session of its own
    event = await _event(request, body)
    front = sessions(request)
    session = await front.open(_scope(request), session_hash, event.email)
    try:
        # One request path: the pool's attempts (its queue, refusals, retries, queue
        # timeout), each leased under the session as a queued event is (_front_event.py).
        with as_visitor(event.email):  # a page's visitor: also an anonymous caller
            async for attempt in pool.call(
                event.api_name, email=event.email, space=session.scope, session=session.core,
                queue_timeout_s=event.queue_timeout_s,
            ):  # fmt: skip
                with attempt:
                    msg, app = await _attempt(attempt, session, event, request)
                    break
    finally:
        session.touch()
    raw = msg.get("output") or {}
    files = front.outputs.boundary.saw_outputs(raw)
    with contextlib.suppress(PoolError):
        await front.outputs.mark(files)  # made known to the fleet's trust boundary
    output = rewriter(app.src, event.front_root)(raw)
    if not msg.get("success", True):
        return JSONResponse(output, status_code=500)
    return JSONResponse(output)


async def _attempt(
    attempt: CallAttempt, session: FrontSession, event: EventRequest, request: Request
) -> tuple[dict[str, Any], AppInfo]:
    """One attempt: leased under the session (the first admitted event pins it), run
    at the Space in the session's upstream session; its completion message."""
    completion: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    def relay(msg: dict[str, Any]) -> None:
        if msg.get("msg") == "process_completed" and not completion.done():
            completion.set_result(msg)

    async with contextlib.AsyncExitStack() as stack:
        pinning = session.pinning if session.space is None else contextlib.nullcontext()
        async with pinning:
            handle = await stack.enter_async_context(attempt.lease(avoid=session.avoid))
            session.space = context_of(request).space = handle.space
        await pass_gate()  # its key revoked, or out of Space-seconds: not run
        app = await app_of(session.front.pool, handle.space)
        endpoint = app.endpoints.get(event.fn_index)
        if endpoint is None or endpoint.api_name != event.api_name:  # another replica
            try:
                endpoint = app.endpoint(event.api_name)
            except ValueError as exc:
                raise InvalidRequest(f"{handle.space} cannot run this event: {exc}") from None
        job = await handle.relay(endpoint.fn_index, event.data, relay, event.fields)
        try:
            await job.result()
        except PoolError:
            if not completion.done():  # no answer of the Space's to give
                raise
        msg = await asyncio.wait_for(asyncio.shield(completion), _COMPLETION_WAIT_S)
    return msg, app
