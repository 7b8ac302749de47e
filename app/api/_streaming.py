"""``POST /api/predict`` as Server-Sent Events: ``"stream": true`` or ``Accept: text/event-stream``.

The predict runs as a task of its own (``get_pool().predict(..., on_partial=...)``)
that fills a :class:`LatestEvents` buffer; the response reads from it. Every event's
``data`` carries ``stage`` like a job's events do::

    {"stage": "running", "space": "alpha"}                          admitted
    {"stage": "running", "space": "alpha", "partial": ..., "partial_index": 0}
    {"stage": "running", "space": "alpha", "upstream_rank": 0, "upstream_queue_size": 1,
     "upstream_eta_s": 1.5}                                         (until the Space starts it)
    {"stage": "running", "space": "alpha", "progress": [...], "log": {...}}   (_progress.py)
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
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from pool import Partial, Pool
from pool.transport import Feed

from ..calls import CheckedCall, UpstreamView
from ..core import (
    KEEPALIVE_S,
    RequestContext,
    ServiceSettings,
    context_of,
    describe,
    hold_stream,
)
from ..edge import FileOutput, PredictRequest, pass_gate, to_jsonable

_log = logging.getLogger("spacepool.app")
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
    only the latest ``keep`` (a :class:`~pool.transport.Feed`, the pool's one bounded
    buffer: a reader that falls behind skips older ones, never the latest). State
    changes are plain methods without ``await``; each wakes the reader.
    """

    def __init__(self, keep: int) -> None:
        self.partials = Feed(keep)  # (space, Partial) pairs
        self._taken = 0  # the partials' index the reader is at
        self.dropped = 0  # partials the reader skipped (it fell more than ``keep`` behind)
        self.admitted: list[str] = []  # Spaces that took the call (a retry adds one)
        self.final: dict[str, Any] | BaseException | None = None
        self.upstream: dict[str, Any] | None = None  # fields not sent yet (app/calls/_progress.py)
        self._sent: dict[str, Any] = {}  # the upstream fields as the reader last got them

    def admit(self, space: str) -> None:
        self.admitted.append(space)
        self.partials.poke()

    def partial(self, space: str, partial: Partial) -> None:
        self.partials.append((space, partial))

    def note(self, fields: dict[str, Any]) -> None:
        """Upstream fields changed; a change undone before the reader took it (a call
        queued at rank 0 that started at once) is not sent at all."""
        pending = {**(self.upstream or {}), **fields}
        pending = {k: v for k, v in pending.items() if self._sent.get(k) != v}
        self.upstream = pending or None
        self.partials.poke()

    def take_upstream(self) -> dict[str, Any] | None:
        """The upstream fields not sent yet (None: nothing new)."""
        upstream, self.upstream = self.upstream, None
        self._sent.update(upstream or {})
        return upstream

    def finish(self, final: dict[str, Any] | BaseException) -> None:
        self.final = final
        self.partials.close()

    def take(self) -> tuple[list[str], list[tuple[str, Partial]]]:
        """The pending admitted Spaces and partials (the final stays for ``final``)."""
        admitted, self.admitted = self.admitted, []
        first, partials = self.partials.since(self._taken)
        self.dropped += first - self._taken
        self._taken = first + len(partials)
        return admitted, partials

    async def changed(self) -> None:
        """Return once there is something to take (or the predict ended)."""
        if self.admitted or self.upstream is not None or self.final is not None:
            return
        await self.partials.wait(self._taken)


async def open_stream(
    pool: Pool, call: CheckedCall, request: Request, settings: ServiceSettings,
    files: FileOutput,
) -> StreamingResponse:
    """Start the predict; answer with its SSE stream once admitted (or raise its error).

    The stream owns ``call``: its uploaded files are deleted when the predict ends. It
    is one of the caller's open streams from now on (app/core/_streams.py: 429 past
    ``POOL_MAX_STREAMS_PER_CALLER``), queued or running."""
    body = call.body
    held = hold_stream(request, body.email)
    ctx = context_of(request)
    events = LatestEvents(pool.settings.stream_keep)

    async def admitted(space: str) -> None:
        ctx.space = space
        await pass_gate(space)  # its key revoked, or out of Space-seconds: not run
        events.admit(space)

    async def partial(p: Partial) -> None:
        events.partial(ctx.space or "", p)

    async def note(fields: dict[str, Any]) -> None:
        events.note(fields)

    upstream = UpstreamView(note)

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
            upstream.close()
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
            await events.changed()
    except BaseException:  # the caller went away while queued
        task.cancel()
        held.release()
        raise
    if isinstance(events.final, BaseException) and not events.admitted:
        held.release()
        raise events.final  # never admitted: the plain HTTP error
    return _EventStream(held.over(_read(events, task, ctx, files)), task)


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
            if final is None and (upstream := events.take_upstream()) is not None:
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
                    await events.changed()
            except TimeoutError:
                yield b": keepalive\n\n"
    finally:
        task.cancel()  # the reader left early: cancel upstream, free the slot (no-op if done)
