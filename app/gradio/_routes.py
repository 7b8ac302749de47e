"""The Gradio API, answered by the service: ``/gradio/{alias}/…`` and ``/gradio/…``.

The routes both clients call (gradio_client client.py, utils.py ``*_URL``; @gradio/client
``client/js/src/constants.ts``), as a Space answers them (gradio/routes.py): ``config``,
and under ``gradio_api/``: ``info``, ``app_id``, ``queue/join``, ``queue/data``,
``cancel``, ``reset``, ``heartbeat/{session_hash}``, ``upload``, ``file={path}``; and
``login``/``logout`` with Gradio's login check for a Space behind one (:mod:`._login`).
Each event goes through the admission of ``/api/predict`` (:mod:`._front_sessions`); the
user is the ``X-Spacepool-User`` header, the API token (``POOL_API_TOKEN``) a bearer
header. A join is answered at once and its event waits in the pool's queue, as on a
Gradio server (docs/gradio-front.md, "Queueing"); busy is the Space's own answer to a
full queue, a 503 on ``queue/join``, which gradio_client raises as ``QueueError`` and
@gradio/client reports as its "This application is currently busy" status. Uploads
are kept by the service (the event's Space gets its own copy when the event is
joined); output files are served by the service from the Space that made them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import UploadFile

from pool import BusyError, InvalidRequest, PoolError, UserLimitReached, get_pool
from pool.admission import CURRENT
from pool.transport import safe_name

from ..core import bounded, context_of, describe, services_of, settings_of
from ..edge import (
    EMAIL_MAX_CHARS,
    BadJson,
    FileStore,
    file_response,
    is_email,
    parse_json,
    require_api_token,
    upload_id,
    upload_token,
)
from ..teams import Keys, Usage
from . import _login, _rest
from ._event_request import EventRequest, event_of
from ._front_errors import FrontBusy, FrontUnavailable, NotYours
from ._front_session import FrontSession
from ._front_sessions import FrontSessions
from ._space_view import SeveralApps, file_headers, front_config, front_info, served
from ._visitors import visitor_email

USER_HEADER = "x-spacepool-user"
# The heartbeat's cadence until the Space's own is known (it is measured on the Space's
# streams: pool/transport/_space.py ``Cadence``), and the longest.
ALIVE_S, ALIVE_MAX_S = 1.0, 30.0
MAX_UPLOADS = 16  # files in one upload request
_SSE = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

Endpoint = Callable[[Request], Awaitable[Response]]
router = APIRouter(include_in_schema=False)


async def _token_or_quota(request: Request) -> None:
    """:func:`require_api_token`; a join its key's daily quota refuses goes on to its
    route, which answers it as a Space answers an event that fails (:func:`join`): the
    clients raise the service's message (gradio_client's bare 429 said nothing)."""
    try:
        await require_api_token(request)
    except UserLimitReached as exc:
        if not request.url.path.endswith("/gradio_api/queue/join"):
            raise
        request.state.quota_refusal = exc
        # Its session is the key's (users are hashed within their key): as the key's.
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        keys = services_of(request).find(Keys)
        if scheme.lower() == "bearer" and keys is not None:
            record = await keys.find(bearer.strip())
            if record is not None:
                CURRENT.set(record.consumer())


_TOKEN = [Depends(_token_or_quota)]


def sessions(request: Request) -> FrontSessions:
    return services_of(request).get(FrontSessions)


def _scope(request: Request) -> str | None:
    alias = request.path_params.get("alias")
    return str(alias) if alias is not None else None


def _front_root(request: Request) -> str:
    """The service's address of this scope: ``POOL_PUBLIC_URL``'s when set (never a
    caller's ``Host`` header then), else as the client reached it."""
    scope = _scope(request)
    public = settings_of(request).public_url
    base = (public or str(request.base_url)).rstrip("/")
    return f"{base}/gradio/{scope}" if scope is not None else f"{base}/gradio"


def _link_root(request: Request) -> str:
    """The scope's address in the links the service answers with (login and logout
    redirects): ``POOL_PUBLIC_URL``'s when set, else a path (``/gradio/…`` under the
    root path), which the caller resolves against the address it used: never built
    from its ``Host`` header (issue 38). A config's ``root`` must be absolute for the
    clients (:func:`_front_root`; docs/gradio-front.md, "The config's root")."""
    if settings_of(request).public_url:
        return _front_root(request)
    scope = _scope(request)
    base = str(request.scope.get("root_path", "")).rstrip("/")
    return f"{base}/gradio/{scope}" if scope is not None else f"{base}/gradio"


def _email(request: Request) -> str | None:
    """The ``X-Spacepool-User`` header, checked as the JSON API checks ``email``; without
    one, a page's visitor while pages are served (:mod:`._visitors`)."""
    value = request.headers.get(USER_HEADER, "").strip()
    if value and not is_email(value):
        raise InvalidRequest(f"{USER_HEADER} must be an email address (at most"
                             f" {EMAIL_MAX_CHARS} characters)")  # fmt: skip
    return value or visitor_email(request)


def _error(exc: BaseException) -> Response:
    """A failure as a Space answers it: ``{"detail": ...}``; busy as a full queue."""
    if isinstance(exc, FrontUnavailable):
        return JSONResponse({"detail": str(exc)}, status_code=501)
    problem = describe(exc)
    message = str(problem.body.get("message") or problem.body.get("error") or "error")
    detail: str | list[dict[str, Any]] = message
    if isinstance(exc, BusyError) or problem.status == 503:
        detail = f"Queue is full. {message}"
    elif problem.status == 422:
        detail = [_invalid(message)]
    return JSONResponse({"detail": detail, **problem.body}, status_code=problem.status,
                        headers=problem.headers)  # fmt: skip


def _invalid(message: str) -> dict[str, Any]:
    """A refused input as Gradio's validators answer a join's 422 (``detail``: a list of
    these; gradio/routes.py ``queue_join``'s ``validator_error``): the clients read it
    (gradio_client ``utils.extract_validation_message`` → ``ValidationError``;
    @gradio/client shows ``detail``). Our messages start with where: ``data[0]: …``."""
    where, sep, what = message.partition(": ")
    if not sep or " " in where:
        where, what = "data", message
    return {"__type__": "validate", "is_valid": False, "parameter_name": where, "message": what}


# -- config and API ----------------------------------------------------------------------
async def config(request: Request) -> Response:
    _, app = await served(get_pool(), _scope(request))
    return JSONResponse(front_config(app, _front_root(request)))


async def info(request: Request) -> Response:
    """The Space's ``info`` as it answers it (with the caller's query)."""
    status, body = await front_info(get_pool(), _scope(request), request.query_params,
                                    _front_root(request))  # fmt: skip
    return JSONResponse(body, status_code=status)


async def app_id(request: Request) -> Response:
    _, app = await served(get_pool(), _scope(request))
    return JSONResponse({"app_id": app.app_id})


# -- files ---------------------------------------------------------------------------------
def _store(request: Request) -> FileStore:
    return services_of(request).get(FileStore)


async def upload(request: Request) -> Response:
    """``POST upload`` (multipart ``files``): kept in the service's file store (0600,
    ``POOL_MAX_UPLOAD_BYTES`` per file, counted in ``POOL_FILE_MAX_TOTAL_BYTES``,
    expiring after ``POOL_FILE_TTL_S``); answered with opaque ids, which the trust
    boundary turns back into the file when an event names one (app.edge._boundary)."""
    store, limit = _store(request), settings_of(request).max_upload_bytes
    paths: list[str] = []
    async with request.form(max_files=MAX_UPLOADS, max_fields=MAX_UPLOADS) as form:
        for item in form.getlist("files"):
            if isinstance(item, str):
                continue
            name = safe_name(item.filename)
            local = await store.receive(_chunks(item), name, limit)
            token, _ = await asyncio.to_thread(store.keep, local)
            if (usage := services_of(request).find(Usage)) is not None:
                usage.on_upload(local.size)  # in the key's usage (issue 38)
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
    on this origin either way (app.edge._serving.inert_headers)."""
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
            stack = contextlib.AsyncExitStack()
            response = await stack.enter_async_context(pool.space_file(name, checked))
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
    """The JSON body (bounded nesting: app.edge._boundary.parse_json); None if not JSON."""
    try:
        return parse_json(await request.body())
    except BadJson:
        return None


async def join(request: Request) -> Response:
    """The event queued and named at once (gradio/routes.py ``queue_join``); it waits
    in the pool's queue (:meth:`FrontSession.join`)."""
    body = await _body(request)
    session_hash = body.get("session_hash") if isinstance(body, dict) else None
    if not isinstance(session_hash, str) or not session_hash:
        return JSONResponse({"detail": "session_hash is required"}, status_code=400)
    refused: UserLimitReached | None = getattr(request.state, "quota_refusal", None)
    if refused is not None:  # named, then completed with the quota's message at once
        session = await sessions(request).open(_scope(request), session_hash, _email(request))
        event_id = uuid.uuid4().hex
        await session.outbox.refuse(event_id, str(refused))
        context_of(request).outcome = refused.reason
        return JSONResponse({"event_id": event_id})
    event = await _event(request, body)
    session = await sessions(request).open(_scope(request), session_hash, event.email)
    event_id = await session.join(event)
    context_of(request).space = session.space
    return JSONResponse({"event_id": event_id})


async def _event(request: Request, body: dict[str, Any]) -> EventRequest:
    email = _email(request)
    context_of(request).user = get_pool().hash_user(email)
    return await event_of(get_pool(), sessions(request).outputs, _scope(request), body, email,
                          _front_root(request))  # fmt: skip


async def data(request: Request) -> Response:
    session_hash = request.query_params.get("session_hash", "")
    session = await sessions(request).find(_scope(request), session_hash, _email(request))
    if session is None:
        return JSONResponse({"detail": "Not Found"}, status_code=404)
    stream = bounded(request, _email(request), _stream(session))  # 429 past the cap
    return StreamingResponse(stream, media_type="text/event-stream", headers=_SSE)


async def _stream(session: FrontSession) -> AsyncIterator[str]:
    """The session's messages (gradio/routes.py ``queue_data``): heartbeats while idle;
    ends with ``close_stream`` once no event is pending. The messages come through the
    coordinator: this worker need not be the one running the events. A read that ends
    by itself (this process drains, no event pending) ends the stream the same way."""
    try:
        async for item in session.messages():
            if item is None:
                yield 'data: {"msg": "heartbeat"}\n\n'
                continue
            msg, last = item
            yield f"data: {json.dumps(msg)}\n\n"
            if last:
                break
        yield 'data: {"msg": "close_stream"}\n\n'
    finally:
        session.touch()


async def cancel(request: Request) -> Response:
    body = await _body(request)
    if isinstance(body, dict):
        hashed = str(body.get("session_hash", ""))
        session = await sessions(request).find(_scope(request), hashed, _email(request))
        if session is not None:
            await session.cancel(str(body.get("event_id", "")))
    return JSONResponse({"success": True})


async def reset(request: Request) -> Response:
    """A no-op, as on the Space (gradio/routes.py ``reset_iterator``)."""
    return JSONResponse({"success": True})


async def heartbeat(request: Request) -> Response:
    """Keeps the session alive; when the client closes it the session ends (its
    events cancelled, its core session closed)."""
    front = sessions(request)
    hashed = str(request.path_params["session_hash"])
    session = await front.open(_scope(request), hashed, _email(request))
    name = None
    with contextlib.suppress(PoolError, FrontUnavailable):  # none answers: the default
        name, _ = await served(get_pool(), _scope(request))
    beats = bounded(request, _email(request), _beats(front, session, name))
    return StreamingResponse(beats, media_type="text/event-stream", headers=_SSE)


async def _cadence(front: FrontSessions, session: FrontSession, served_by: str | None
                   ) -> float | None:  # fmt: skip
    """The heartbeat cadence the pool measured on the session's Space (else the served
    one's; measured now if it never was): None while not known."""
    space = session.ran_on or served_by
    if space is None:
        return None
    with contextlib.suppress(Exception):  # not known (the Space does not answer)
        return await front.pool.space_cadence(space)
    return None


async def _beats(
    front: FrontSessions, session: FrontSession, served_by: str | None
) -> AsyncIterator[str]:
    """``ALIVE`` at the Space's own cadence (gradio/routes.py ``heartbeat``), as the
    pool last measured it on the session's Space (else the served one's; measured now
    if it never was), or every :data:`ALIVE_S` until it is: a client that changes
    session leaves this stream at its next line (gradio_client ``_stream_heartbeat``),
    and one that went away is seen at the next write. The stream ends when the process
    starts to stop (app/core/_draining.py): the client's next heartbeat reaches another worker,
    and this one's shutdown does not wait for a stream that never ends."""
    draining = front.draining
    session.heartbeats += 1
    try:
        while not draining.is_set():
            yield "data: ALIVE\n\n"
            cadence = await _cadence(front, session, served_by)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    draining.wait(), ALIVE_S if cadence is None else min(ALIVE_MAX_S, cadence)
                )
    finally:
        session.heartbeats -= 1
        session.touch()
        # Ended by the client: the session ends. Ended by this worker's stop: the client
        # comes back (on another worker); the session expires by its idle rule if not.
        if session.heartbeats == 0 and not draining.is_set():
            front.end_later(session)


async def call_post(request: Request) -> Response:
    email = _email(request)
    context_of(request).user = get_pool().hash_user(email)
    return await _rest.call_post(request, sessions(request), _scope(request), email,
                                 _front_root(request))  # fmt: skip


async def call_get(request: Request) -> Response:
    return await _rest.call_get(request, sessions(request), _email(request))


async def login(request: Request) -> Response:
    answer = await _login.login(request, _scope(request), _link_root(request))
    # A page's own login form (a same-origin fetch) says "incorrect credentials" on the
    # Space's own 400 only; the clients (no Sec-Fetch-Site) read a 401 as wrong ones.
    if answer.status_code == 401 and request.headers.get("sec-fetch-site") == "same-origin":
        answer.status_code = 400
    return answer


async def logout(request: Request) -> Response:
    return _login.logout(_scope(request), _link_root(request))


def _answering(endpoint: Endpoint, *, checked: bool = True) -> Endpoint:
    """``endpoint`` with our failures answered as a Space answers its own; ``checked``:
    behind the scope's Gradio login, if it has one (:mod:`._login`)."""

    @functools.wraps(endpoint)
    async def answered(request: Request) -> Response:
        try:
            if checked and (refused := await _login.refusal(request, _scope(request))):
                return refused
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
        except SeveralApps as exc:
            apps = [{"app": app, "spaces": names, "urls": [f"/gradio/{n}/" for n in names]}
                    for app, names in exc.apps.items()]  # fmt: skip
            return JSONResponse({"detail": str(exc), "error": "several_apps", "apps": apps},
                                status_code=409)  # fmt: skip
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
        router.add_api_route(path, _answering(endpoint), methods=methods, dependencies=_TOKEN)
    # Not behind POOL_API_TOKEN: gradio_client's _login sends no headers (client.py).
    router.add_api_route(base + "/login", _answering(login, checked=False), methods=["POST"])
    router.add_api_route(base + "/logout", _answering(logout, checked=False), methods=["GET"])


_add("/gradio")
_add("/gradio/{alias}")
