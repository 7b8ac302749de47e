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
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import UploadFile

from pool import BusyError, InvalidRequest, PoolError, get_pool
from pool.transport import safe_name

from .._auth import require_api_token
from .._boundary import BadJson, parse_json, upload_id, upload_token
from .._errors import describe
from .._files import FileStore, file_response
from .._logging import context_of
from .._schemas import EMAIL_MAX_CHARS, is_email
from .._settings import ServiceSettings
from . import _rest
from ._rewrite import rewriter
from ._session import (
    EventRequest,
    FrontBusy,
    FrontSession,
    FrontSessions,
    FrontUnavailable,
    NotYours,
)
from ._upstream import file_headers, front_config, open_file, served, transport_of

USER_HEADER = "x-spacepool-user"
KEEPALIVE_S = 15.0  # gradio/utils.py get_heartbeat_rate
# Our heartbeat stream writes more often than a Space's: a client that went away (whose
# close does not shut the socket: gradio_client) is seen at the next write.
ALIVE_S = 5.0
MAX_UPLOADS = 16  # files in one upload request
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
    """The ``X-Spacepool-User`` header, checked as the JSON API checks ``email``."""
    value = request.headers.get(USER_HEADER, "").strip()
    if value and not is_email(value):
        raise InvalidRequest(f"{USER_HEADER} must be an email address (at most"
                             f" {EMAIL_MAX_CHARS} characters)")  # fmt: skip
    return value or None


def _user(request: Request) -> str | None:
    """The keyed hash of the request's user (a front session's owner)."""
    return get_pool().hash_user(_email(request))


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
def _store(request: Request) -> FileStore:
    store: FileStore = request.app.state.files
    return store


async def upload(request: Request) -> Response:
    """``POST upload`` (multipart ``files``): kept in the service's file store (0600,
    ``POOL_MAX_UPLOAD_BYTES`` per file, counted in ``POOL_FILE_MAX_TOTAL_BYTES``,
    expiring after ``POOL_FILE_TTL_S``); answered with opaque ids, which the trust
    boundary turns back into the file when an event names one (app._boundary)."""
    store, limit = _store(request), _settings(request).max_upload_bytes
    paths: list[str] = []
    async with request.form(max_files=MAX_UPLOADS, max_fields=MAX_UPLOADS) as form:
        for item in form.getlist("files"):
            if isinstance(item, str):
                continue
            name = safe_name(item.filename)
            local = await store.receive(_chunks(item), name, limit)
            token, _ = await asyncio.to_thread(store.keep, local)
            paths.append(upload_id(token, name))
    return JSONResponse(paths)


async def _chunks(item: UploadFile) -> AsyncIterator[bytes]:
    while chunk := await item.read(64 * 1024):
        yield chunk


def _space_path(path: str) -> str | None:
    """``path`` if it names a file under the Space's ``file=`` route, else None: no
    ``..`` (encoded or not: the route's parameter arrives decoded), no backslash or
    control character, so a ``file=`` request cannot reach another route."""
    if not path or any(ch in path for ch in "\\\x00?#") or not path.isprintable():
        return None
    if any(part in ("..", ".") for part in path.split("/")):
        return None
    return path


async def file(request: Request) -> Response:
    """``GET file={path}``: an upload of ours, or the Space's file (streamed); inert
    on this origin either way (app._files.inert_headers)."""
    path = str(request.path_params["path"])
    token = upload_token(path)
    if token is not None:
        return file_response(_store(request), token, request, inline_media=True)
    checked = _space_path(path)
    if checked is None:
        return JSONResponse({"detail": "File not found"}, status_code=404)
    pool, scope = get_pool(), _scope(request)
    names = [scope] if scope is not None else list(pool.spaces)
    for name in names:
        with contextlib.suppress(Exception):
            transport, app = await transport_of(pool, name)
            stack = contextlib.AsyncExitStack()
            response = await stack.enter_async_context(open_file(transport, app, checked))
            if response is None:
                await stack.aclose()
                continue
            return StreamingResponse(_file_body(response, stack),
                                     headers=file_headers(response, checked))  # fmt: skip
    return JSONResponse({"detail": "File not found"}, status_code=404)


async def _file_body(response: Any, stack: contextlib.AsyncExitStack) -> AsyncIterator[bytes]:
    async with stack:
        async for chunk in response.aiter_bytes(64 * 1024):
            yield chunk


# -- the queue ---------------------------------------------------------------------------
async def _body(request: Request) -> Any:
    """The JSON body (bounded nesting: app._boundary.parse_json); None if not JSON."""
    try:
        return parse_json(await request.body())
    except BadJson:
        return None


async def join(request: Request) -> Response:
    body = await _body(request)
    session_hash = body.get("session_hash") if isinstance(body, dict) else None
    if not isinstance(session_hash, str) or not session_hash:
        return JSONResponse({"detail": "session_hash is required"}, status_code=400)
    event = await _event(request, body)
    session = sessions(request).open(_scope(request), session_hash, _user(request))
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
    settings = _settings(request)
    data = sessions(request).boundary.values(data, "data")
    endpoint = app.endpoints[fn_index]
    email = _email(request)
    context_of(request).user = pool.hash_user(email)
    return EventRequest(
        api_name=endpoint.api_name if endpoint.public else None, fn_index=fn_index, data=data,
        email=email,
        queue_timeout_s=min(settings.gradio_queue_wait_s, pool.settings.queue_timeout_s),
        front_root=_front_root(request),
    )  # fmt: skip


async def data(request: Request) -> Response:
    session_hash = request.query_params.get("session_hash", "")
    session = sessions(request).get(_scope(request), session_hash, _user(request))
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
        hashed = str(body.get("session_hash", ""))
        session = sessions(request).get(_scope(request), hashed, _user(request))
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
    hashed = str(request.path_params["session_hash"])
    session = front.open(_scope(request), hashed, _user(request))
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
    return await _rest.call_get(request, sessions(request), _user(request))


def _answering(endpoint: Endpoint) -> Endpoint:
    """``endpoint`` with our failures answered as a Space answers its own."""

    @functools.wraps(endpoint)
    async def answered(request: Request) -> Response:
        try:
            return await endpoint(request)
        except (PoolError, FrontUnavailable) as exc:
            return _error(exc)
        except FrontBusy as exc:
            retry = str(max(1, math.ceil(exc.retry_after_s)))
            return JSONResponse({"detail": f"Queue is full. {exc}", "error": "busy",
                                 "retry_after_s": exc.retry_after_s},
                                status_code=503, headers={"Retry-After": retry})  # fmt: skip
        except NotYours:
            return JSONResponse({"detail": "Session not found."}, status_code=404)
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
