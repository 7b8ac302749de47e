"""The Gradio API, answered by the service: ``/gradio/{alias}/…`` and ``/gradio/…``.

The routes both clients call (gradio_client client.py, utils.py ``*_URL``; @gradio/client
``client/js/src/constants.ts``), as a Space answers them (gradio/routes.py): ``config``,
and under ``gradio_api/``: ``info``, ``app_id``, ``queue/join``, ``queue/data``,
``cancel``, ``reset``, ``heartbeat/{session_hash}``, ``upload``, ``file={path}``.
Each event goes through the admission of ``/api/predict`` (:mod:`._session`); the
user is the ``X-Spacepool-User`` header, the API token (``POOL_API_TOKEN``) a bearer
header. Busy is the Space's own answer to a full queue, a 503 on ``queue/join``,
which gradio_client raises as ``QueueError`` and @gradio/client reports as its
"This application is currently busy" status. Uploads are kept by the service (the
event's Space gets its own copy when the event is joined); output files are served
by the service from the Space that made them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from gradio_client import utils as gradio_utils

from pool import BusyError, InvalidRequest, PoolError, get_pool
from pool.transport import safe_name

from .._auth import require_api_token
from .._errors import describe
from .._logging import context_of
from .._settings import ServiceSettings
from . import _rest
from ._rewrite import rewriter
from ._session import EventRequest, FrontSession, FrontSessions, FrontUnavailable
from ._upstream import file_headers, front_config, open_file, served, transport_of

USER_HEADER = "x-spacepool-user"
KEEPALIVE_S = 15.0  # gradio/utils.py get_heartbeat_rate
# Our heartbeat stream writes more often than a Space's: a client that went away (whose
# close does not shut the socket: gradio_client) is seen at the next write.
ALIVE_S = 5.0
_SSE = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

Endpoint = Callable[[Request], Awaitable[Response]]
router = APIRouter(dependencies=[Depends(require_api_token)], include_in_schema=False)


def sessions(request: Request) -> FrontSessions:
    front: FrontSessions = request.app.state.gradio_sessions
    return front


def _settings(request: Request) -> ServiceSettings:
    settings: ServiceSettings = request.app.state.settings
    return settings


def _scope(request: Request) -> str | None:
    alias = request.path_params.get("alias")
    return str(alias) if alias is not None else None


def _front_root(request: Request) -> str:
    """The service's address of this scope, as the client reached it."""
    scope = _scope(request)
    base = str(request.base_url).rstrip("/")
    return f"{base}/gradio/{scope}" if scope is not None else f"{base}/gradio"


def _email(request: Request) -> str | None:
    value = request.headers.get(USER_HEADER, "").strip()
    if len(value) > 320:
        raise InvalidRequest(f"{USER_HEADER} longer than 320 characters")
    return value or None


def _error(exc: BaseException) -> Response:
    """A failure as a Space answers it: ``{"detail": ...}``; busy as a full queue."""
    if isinstance(exc, FrontUnavailable):
        return JSONResponse({"detail": str(exc)}, status_code=501)
    problem = describe(exc)
    detail = problem.body.get("message") or problem.body.get("error") or "error"
    if isinstance(exc, BusyError) or problem.status == 503:
        detail = f"Queue is full. {detail}"
    return JSONResponse({"detail": detail, **problem.body}, status_code=problem.status,
                        headers=problem.headers)  # fmt: skip


# -- config and API ----------------------------------------------------------------------
async def config(request: Request) -> Response:
    _, _, app = await served(get_pool(), _scope(request))
    return JSONResponse(front_config(app, _front_root(request)))


async def info(request: Request) -> Response:
    """The Space's ``info`` as it answers it (with the caller's query)."""
    _, transport, app = await served(get_pool(), _scope(request))
    upstream = await transport.home.send(transport.http, "GET", app.url("info"),
                                         params=request.query_params)  # fmt: skip
    body = rewriter(app.src, _front_root(request))(upstream.json())
    return JSONResponse(body, status_code=upstream.status_code)


async def app_id(request: Request) -> Response:
    _, _, app = await served(get_pool(), _scope(request))
    return JSONResponse({"app_id": app.app_id})


# -- files ---------------------------------------------------------------------------------
def uploads_dir(settings: ServiceSettings) -> Path:
    return Path(settings.file_dir).resolve().parent / "gradio-uploads"


async def upload(request: Request) -> Response:
    """``POST upload`` (multipart ``files``): kept here; the paths returned are the
    service's, and the event's Space gets a copy when the event joins."""
    folder = uploads_dir(_settings(request)) / secrets.token_hex(12)
    paths: list[str] = []
    async with request.form() as form:
        for item in form.getlist("files"):
            if isinstance(item, str):
                continue
            os.makedirs(folder, exist_ok=True)
            target = folder / safe_name(item.filename)
            with target.open("wb") as out:
                while chunk := await item.read(64 * 1024):
                    out.write(chunk)
            paths.append(str(target))
    return JSONResponse(paths)


def _own_upload(request: Request, path: str) -> Path | None:
    root = uploads_dir(_settings(request))
    candidate = Path(path).resolve()
    return candidate if candidate.is_relative_to(root) and candidate.is_file() else None


async def file(request: Request) -> Response:
    """``GET file={path}``: an upload of ours, or the Space's file (streamed)."""
    path = str(request.path_params["path"])
    own = _own_upload(request, path)
    if own is not None:
        return FileResponse(own)
    pool, scope = get_pool(), _scope(request)
    names = [scope] if scope is not None else list(pool.spaces)
    for name in names:
        with contextlib.suppress(Exception):
            transport, app = await transport_of(pool, name)
            stack = contextlib.AsyncExitStack()
            response = await stack.enter_async_context(open_file(transport, app, path))
            if response is None:
                await stack.aclose()
                continue
            return StreamingResponse(_file_body(response, stack), headers=file_headers(response))
    return JSONResponse({"detail": "File not found"}, status_code=404)


async def _file_body(response: Any, stack: contextlib.AsyncExitStack) -> AsyncIterator[bytes]:
    async with stack:
        async for chunk in response.aiter_bytes(64 * 1024):
            yield chunk


def _check_files(request: Request, data: list[Any]) -> None:
    """Every file among the inputs is an upload of ours or a URL: a client cannot make
    the service send one of its own files."""

    def check(item: dict[str, Any]) -> dict[str, Any]:
        path = str(item.get("path", ""))
        if not gradio_utils.is_http_url_like(path) and _own_upload(request, path) is None:
            raise InvalidRequest("a file input must be uploaded to this service first")
        return item

    gradio_utils.traverse(data, check, gradio_utils.is_file_obj_with_meta)


# -- the queue ---------------------------------------------------------------------------
async def _body(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        return None


async def join(request: Request) -> Response:
    body = await _body(request)
    session_hash = body.get("session_hash") if isinstance(body, dict) else None
    if not isinstance(session_hash, str) or not session_hash:
        return JSONResponse({"detail": "session_hash is required"}, status_code=400)
    event = await _event(request, body)
    session = sessions(request).open(_scope(request), session_hash)
    event_id = await session.join(get_pool(), event)
    context_of(request).space = session.space
    return JSONResponse({"event_id": event_id})


async def _event(request: Request, body: dict[str, Any]) -> EventRequest:
    pool = get_pool()
    scope = _scope(request)
    _, _, app = await served(pool, scope)
    fn_index, data = body.get("fn_index"), body.get("data")
    if not isinstance(fn_index, int) or fn_index not in app.endpoints:
        raise InvalidRequest(f"no function {fn_index!r} in this app")
    if not isinstance(data, list):
        raise InvalidRequest("data must be a list")
    _check_files(request, data)
    endpoint = app.endpoints[fn_index]
    email = _email(request)
    context_of(request).user = pool.hash_user(email)
    settings = _settings(request)
    return EventRequest(
        api_name=endpoint.api_name if endpoint.public else None, fn_index=fn_index, data=data,
        email=email,
        queue_timeout_s=min(settings.gradio_queue_wait_s, pool.settings.queue_timeout_s),
        front_root=_front_root(request),
    )  # fmt: skip


async def data(request: Request) -> Response:
    session_hash = request.query_params.get("session_hash", "")
    session = sessions(request).get(_scope(request), session_hash)
    if session is None:
        return JSONResponse({"detail": "Not Found"}, status_code=404)
    return StreamingResponse(_stream(session), media_type="text/event-stream", headers=_SSE)


async def _stream(session: FrontSession) -> AsyncIterator[str]:
    """The session's messages (gradio/routes.py ``queue_data``): heartbeats while idle;
    ends with ``close_stream`` once no event is pending."""
    session.streams += 1
    try:
        while True:
            try:
                msg = await asyncio.wait_for(session.outbox.get(), KEEPALIVE_S)
            except TimeoutError:
                yield 'data: {"msg": "heartbeat"}\n\n'
                continue
            session.touched = time.monotonic()
            yield f"data: {json.dumps(msg)}\n\n"
            if session.delivered(msg):
                yield 'data: {"msg": "close_stream"}\n\n'
                return
    finally:
        session.streams -= 1
        session.touched = time.monotonic()


async def cancel(request: Request) -> Response:
    body = await _body(request)
    if isinstance(body, dict):
        session = sessions(request).get(_scope(request), str(body.get("session_hash", "")))
        if session is not None:
            await session.cancel(str(body.get("event_id", "")))
    return JSONResponse({"success": True})


async def reset(request: Request) -> Response:
    """A no-op, as on the Space (gradio/routes.py ``reset_iterator``)."""
    return JSONResponse({"success": True})


async def heartbeat(request: Request) -> Response:
    """Keeps the session alive; when the client closes it the session ends (its
    events cancelled, the upstream session's heartbeat closed)."""
    front = sessions(request)
    session = front.open(_scope(request), str(request.path_params["session_hash"]))
    return StreamingResponse(_beats(front, session), media_type="text/event-stream",
                             headers=_SSE)  # fmt: skip


async def _beats(front: FrontSessions, session: FrontSession) -> AsyncIterator[str]:
    session.heartbeats += 1
    try:
        while True:
            yield "data: ALIVE\n\n"
            await asyncio.sleep(ALIVE_S)
    finally:
        session.heartbeats -= 1
        session.touched = time.monotonic()
        if session.heartbeats == 0:
            front.end_later(session)


async def call_post(request: Request) -> Response:
    return await _rest.call_post(request, sessions(request), _scope(request), _event)


async def call_get(request: Request) -> Response:
    return await _rest.call_get(request, sessions(request))


def _answering(endpoint: Endpoint) -> Endpoint:
    """``endpoint`` with our failures answered as a Space answers its own."""

    @functools.wraps(endpoint)
    async def answered(request: Request) -> Response:
        try:
            return await endpoint(request)
        except (PoolError, FrontUnavailable) as exc:
            return _error(exc)
        except httpx.HTTPError as exc:
            detail = f"the Space failed ({type(exc).__name__})"
            return JSONResponse({"detail": detail}, status_code=502)

    return answered


def _add(base: str) -> None:
    api = base + "/gradio_api"
    for path, endpoint, methods in (
        (base + "/config", config, ["GET"]),
        (api + "/info", info, ["GET"]),
        (api + "/app_id", app_id, ["GET"]),
        (api + "/upload", upload, ["POST"]),
        (api + "/file={path:path}", file, ["GET"]),
        (api + "/queue/join", join, ["POST"]),
        (api + "/queue/data", data, ["GET"]),
        (api + "/cancel", cancel, ["POST"]),
        (api + "/reset", reset, ["POST"]),
        (api + "/heartbeat/{session_hash}", heartbeat, ["GET"]),
        (api + "/call/{api_name}", call_post, ["POST"]),
        (api + "/call/{api_name}/{event_id}", call_get, ["GET"]),
    ):
        router.add_api_route(path, _answering(endpoint), methods=methods)


_add("/gradio")
_add("/gradio/{alias}")
