"""``POST /api/predict`` as Server-Sent Events: ``"stream": true`` or ``Accept: text/event-stream``.

The predict runs as a task of its own (``get_pool().predict(..., on_partial=...)``)
that fills a :class:`LatestEvents` buffer; the response reads from it. Every event's
``data`` carries ``stage`` like a job's events do::

    {"stage": "running", "space": "alpha"}                          admitted
    {"stage": "running", "space": "alpha", "partial": ..., "partial_index": 0}
    {"stage": "running", "space": "alpha", "upstream_rank": 0, "upstream_eta_s": 1.5}
    {"stage": "running", "space": "alpha", "progress": [...], "log": {...}}   (_upstream.py)
    {"stage": "done", "space", "result", "queued_ms", "duration_ms", "attempts"}
    event: error
    {"stage": "failed", "status": 502, "error": "upstream", "message": ..., "request_id"}

The response starts once the request holds a slot: an error before that (busy, unknown
Space, bad body, deadline while queued) is the same plain HTTP error as without
``stream``. After that, an error is the last event, carrying the JSON that error would
have as an HTTP answer, with its ``status``. A plain (non-generator) endpoint gives the
admitted event and one ``done``.

Backpressure: the buffer holds at most ``POOL_STREAM_KEEP`` partials; a reader slower
than the Space skips older ones and still gets the latest and the final event. A
client that disconnects cancels the task: the pool cancels the upstream job and frees
the slot on the way out (the task does not depend on the response).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from pool import Partial, Pool, UpstreamEvent

from ._errors import describe
from ._files import FileOutput
from ._inputs import Call
from ._logging import RequestContext, context_of
from ._schemas import PredictRequest, to_jsonable
from ._settings import ServiceSettings
from ._upstream import UpstreamView

_log = logging.getLogger("spacepool.app")
KEEPALIVE_S = 15.0
_tasks: set[asyncio.Task[None]] = set()  # running predicts (kept referenced until done)


def wants_stream(body: PredictRequest, request: Request) -> bool:
    """``"stream": true`` in the body, or ``text/event-stream`` among the accepted types."""
    if body.stream:
        return True
    accept = request.headers.get("accept", "")
    return any(part.split(";")[0].strip().lower() == "text/event-stream"
               for part in accept.split(","))  # fmt: skip


class LatestEvents:
    """What the predict produced and the reader has not taken yet, bounded.

    ``admitted`` and the final event (result or error) are always kept; of the partials
    only the latest ``keep``. State changes are plain methods without ``await``.
    """

    def __init__(self, keep: int) -> None:
        self.partials: deque[tuple[str, Partial]] = deque(maxlen=keep)
        self.admitted: list[str] = []  # Spaces that took the call (a retry adds one)
        self.final: dict[str, Any] | BaseException | None = None
        self.dropped = 0
        self.upstream: dict[str, Any] | None = None  # fields not sent yet (app/_upstream.py)
        self.changed = asyncio.Event()

    def admit(self, space: str) -> None:
        self.admitted.append(space)
        self.changed.set()

    def partial(self, space: str, partial: Partial) -> None:
        if len(self.partials) == self.partials.maxlen:
            self.dropped += 1
        self.partials.append((space, partial))
        self.changed.set()

    def note(self, fields: dict[str, Any]) -> None:
        self.upstream = {**(self.upstream or {}), **fields}
        self.changed.set()

    def finish(self, final: dict[str, Any] | BaseException) -> None:
        self.final = final
        self.changed.set()

    def take(self) -> tuple[list[str], list[tuple[str, Partial]]]:
        """The pending admitted Spaces and partials (the final stays for ``final``)."""
        admitted, self.admitted = self.admitted, []
        partials = list(self.partials)
        self.partials.clear()
        self.changed.clear()
        return admitted, partials


async def open_stream(
    pool: Pool, call: Call, request: Request, settings: ServiceSettings, files: FileOutput
) -> StreamingResponse:
    """Start the predict; answer with its SSE stream once admitted (or raise its error).

    The stream owns ``call``: its uploaded files are deleted when the predict ends."""
    body = call.body
    ctx = context_of(request)
    events = LatestEvents(pool.settings.stream_keep)

    async def admitted(space: str) -> None:
        ctx.space = space
        events.admit(space)

    async def partial(p: Partial) -> None:
        events.partial(ctx.space or "", p)

    view = UpstreamView()

    async def upstream(event: UpstreamEvent) -> None:
        if (fields := view.update(event)) is not None:
            events.note(fields)

    async def run() -> None:
        try:
            done = await call.predict(
                pool,
                timeout=body.timeout_s or settings.predict_timeout_s,
                on_admitted=admitted,
                on_partial=partial,
                download_to=files.store.partial,
                on_event=upstream,
            )
        except Exception as exc:
            events.finish(exc)
            return
        finally:
            call.cleanup()
        ctx.space, ctx.queued_ms = done.space, done.queued_ms
        events.finish(
            {
                "stage": "done",
                "space": done.space,
                "result": done.result,
                "queued_ms": done.queued_ms,
                "duration_ms": done.duration_ms,
                "attempts": done.attempts,
            }
        )

    task = asyncio.get_running_loop().create_task(run(), name="predict-stream")
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    try:
        while not events.admitted and events.final is None:
            events.changed.clear()
            await events.changed.wait()
    except BaseException:  # the caller went away while queued
        task.cancel()
        raise
    if isinstance(events.final, BaseException) and not events.admitted:
        raise events.final  # never admitted: the plain HTTP error
    return _EventStream(_read(events, task, ctx, files), task)


class _EventStream(StreamingResponse):
    """The SSE response; however it ends (done, disconnect, or a caller gone before the
    first byte, when the body is never read), the predict task is cancelled."""

    def __init__(self, body: AsyncIterator[bytes], task: asyncio.Task[None]) -> None:
        super().__init__(
            body,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._task = task

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._task.cancel()  # no-op once it finished


def _sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def _error_event(exc: BaseException, ctx: RequestContext) -> bytes:
    problem = describe(exc)
    ctx.outcome = problem.outcome
    if problem.body.get("error") == "internal":
        _log.error("stream failed unexpectedly", exc_info=exc,
                   extra={"request_id": ctx.request_id})  # fmt: skip
    body = {"stage": "failed", **problem.body, "status": problem.status,
            "request_id": ctx.request_id}  # fmt: skip
    return _sse(body, "error")


async def _read(
    events: LatestEvents, task: asyncio.Task[None], ctx: RequestContext, files: FileOutput
) -> AsyncIterator[bytes]:
    try:
        while True:
            final = events.final
            admitted, partials = events.take()
            for space in admitted:
                yield _sse({"stage": "running", "space": space})
            if (upstream := events.upstream) is not None and final is None:
                events.upstream = None
                yield _sse({"stage": "running", "space": ctx.space, **upstream})
            for space, p in partials:
                yield _sse(
                    {
                        "stage": "running",
                        "space": space,
                        "partial": to_jsonable(p.output, files.render),
                        "partial_index": p.index,
                    }
                )
            if isinstance(final, BaseException):
                yield _error_event(final, ctx)
                return
            if final is not None:
                yield _sse({**final, "result": to_jsonable(final["result"], files.render)})
                return
            try:
                async with asyncio.timeout(KEEPALIVE_S):
                    await events.changed.wait()
            except TimeoutError:
                yield b": keepalive\n\n"
    finally:
        task.cancel()  # the reader left early: cancel upstream, free the slot (no-op if done)
