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

from pool import InvalidRequest, PoolError, get_pool

from ..core import context_of, services_of
from ..edge import Boundary, pass_gate
from ._rewrite import rewriter
from ._routes import _body, _event, _scope, sessions
from ._space_view import served

_COMPLETION_WAIT_S = 5.0  # after the job's end, for its completion message


async def run(request: Request) -> Response:
    """``run/{api_name}`` as a Space answers it, the event a pool call."""
    body = await _body(request)
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    if not isinstance(body.get("fn_index"), int):  # by name, as routes.py ``get_fn``
        _, _, app = await served(get_pool(), _scope(request))
        try:
            body["fn_index"] = app.endpoint(str(request.path_params["api_name"])).fn_index
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
    session_hash = body.get("session_hash")
    if not isinstance(session_hash, str) or not session_hash:
        session_hash = body["session_hash"] = uuid.uuid4().hex  # a session of its own
    event = await _event(request, body)
    front = sessions(request)
    session = await front.open(_scope(request), session_hash, event.email)
    loop = asyncio.get_running_loop()
    completion: asyncio.Future[dict[str, Any]] = loop.create_future()

    def relay(msg: dict[str, Any]) -> None:
        if msg.get("msg") == "process_completed" and not completion.done():
            completion.set_result(msg)

    try:
        async with front.pool.client(
            event.email, space=session.scope, session=session.core, api_name=event.api_name,
            queue_timeout_s=event.queue_timeout_s, avoid=session.avoid,
        ) as handle:  # fmt: skip
            session.space = context_of(request).space = handle.space
            await pass_gate()  # its key revoked, or out of Space-seconds: not run
            _, app = handle.raw.wire()
            endpoint = app.endpoints.get(event.fn_index)
            if endpoint is None or endpoint.api_name != event.api_name:  # another replica
                endpoint = app.endpoint(str(event.api_name))
            job = await handle.relay(endpoint.fn_index, event.data, relay, event.fields)
            try:
                await job.result()
            except PoolError:
                if not completion.done():  # no answer of the Space's to give
                    raise
            msg = await asyncio.wait_for(asyncio.shield(completion), _COMPLETION_WAIT_S)
    finally:
        session.touch()
    raw = msg.get("output") or {}
    files = services_of(request).get(Boundary).saw_outputs(raw)
    with contextlib.suppress(PoolError):
        await front.mark_outputs(files)  # made known to the fleet's trust boundary
    output = rewriter(app.src, event.front_root)(raw)
    if not msg.get("success", True):
        return JSONResponse(output, status_code=500)
    return JSONResponse(output)
