"""One stand-in Space: a real Gradio app that measures itself and can be told to misbehave.

The Gradio Blocks is mounted at "/" on a FastAPI app, exactly as a Space serves it, so
gradio_client talks to it through the same routes (``/config``, ``/gradio_api/info``,
``/gradio_api/queue/join``, ``/gradio_api/queue/data``) as it would to a Hub Space.

Beside it live three routes of our own under ``/_stand_in/``: ``GET stats``,
``POST reset`` and ``POST control``. They are registered before the Gradio mount, so
the mount at "/" does not shadow them.

Misbehaviour is injected with one pure ASGI middleware (not ``BaseHTTPMiddleware``,
which buffers and would get in the way of the server-sent-event stream):

* ``config_delay_s`` delays every ``GET /config``, like a cold or distant Hub Space;
* mode ``queue_full`` answers ``POST /gradio_api/queue/join`` with HTTP 503, the answer
  Gradio gives when ``queue(max_size=...)`` overflows, so gradio_client raises
  ``gradio_client.utils.QueueError``;
* modes ``hang`` and ``raise`` are read by ``/echo`` itself when a call starts;
* ``refuse_next`` answers the next N queue joins 503 "Queue is full" whatever the queue
  holds (a refusal that is a race, not the Space's limit);
* ``max_size=0`` is a Space with no queue: a join is refused unless a worker is free for
  it now (Gradio's own ``max_size=0`` would refuse every join: ``gradio/queueing.py``
  ``push`` compares the waiting events to ``max_size`` before adding the new one).

The event functions are coroutines: they run on the server's event loop, not in the
anyio worker-thread pool (40 threads by default), so a hundred hanging calls cost no
threads. Every counter sits behind one ``threading.Lock`` anyway, so the numbers stay
right if a function is ever made synchronous.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

import fastapi
import gradio as gr
from pydantic import BaseModel, Field
from starlette.responses import JSONResponse

from devspaces._kinds import KINDS
from devspaces._launch import LOGIN_USERS

Mode = Literal["ok", "queue_full", "hang", "raise", "probe_fail"]

CONFIG_PATHS = frozenset({"/config", "/config/"})
QUEUE_JOIN_PATH = "/gradio_api/queue/join"
APP_ID_PATH = "/gradio_api/app_id"
MAX_INTERVALS = 20_000
HANG_S = 600.0

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass
class _Meter:
    """Everything the Space counts and every knob it obeys; guarded by ``lock``."""

    name: str
    app_id: int
    config_delay_s: float
    mode: Mode = "ok"
    in_flight: int = 0
    peak: int = 0
    total: int = 0
    config_requests: int = 0
    refused: int = 0  # queue joins answered 503 in queue_full mode (or a full queue)
    config_429_s: float = 0.0  # /config answers 429 (Retry-After) until config_429_until
    config_429_until: float = 0.0
    rate_limited: int = 0  # /config requests answered 429
    token: str | None = None  # required as x-hf-authorization (a private Space)
    unauthorized: int = 0  # requests answered 401 for a missing or wrong token
    refuse_next: int = 0  # the next queue joins answered 503 "Queue is full" (a race)
    # max_size=0: the Space's events waiting or running (gradio's queue); a join is
    # refused when they reach the concurrency limit (None: Gradio's own max_size rules)
    no_queue: Callable[[], bool] | None = None

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        # (start, end) wall-clock times of finished calls, so that a test can compute
        # the concurrency of several Spaces together (they share the host's clock).
        self.intervals: list[tuple[float, float]] = []
        # (start, end, text) of finished /echo calls: a test tells its callers apart
        # by the text each sent, on the Space's own clock.
        self.calls: list[tuple[float, float, str]] = []

    def enter(self) -> tuple[Mode, float]:
        """Count a call that starts; return the mode it must obey and its start time."""
        with self.lock:
            self.in_flight += 1
            self.total += 1
            self.peak = max(self.peak, self.in_flight)
            return self.mode, time.time()

    def leave(self, started: float, text: str | None = None) -> None:
        """Count a call that ended, however it ended."""
        with self.lock:
            self.in_flight -= 1
            ended = time.time()
            if len(self.intervals) < MAX_INTERVALS:
                self.intervals.append((started, ended))
            if text is not None and len(self.calls) < MAX_INTERVALS:
                self.calls.append((started, ended, text[:64]))

    def saw_config(self) -> float:
        """Count one ``GET /config``; return the delay to apply to it."""
        with self.lock:
            self.config_requests += 1
            return self.config_delay_s

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "name": self.name,
                "in_flight": self.in_flight,
                "peak": self.peak,
                "total": self.total,
                "config_requests": self.config_requests,
                "refused": self.refused,
                "rate_limited": self.rate_limited,
                "unauthorized": self.unauthorized,
                "app_id": self.app_id,
                "mode": self.mode,
            }

    def reset(self) -> None:
        """Zero peak, total and config counters; calls in flight stay counted."""
        with self.lock:
            self.peak = self.in_flight
            self.total = 0
            self.config_requests = 0
            self.refused = 0
            self.rate_limited = 0
            self.unauthorized = 0
            self.intervals.clear()
            self.calls.clear()


class _Control(BaseModel):
    """Body of ``POST /_stand_in/control``; absent fields are left unchanged."""

    config_delay_s: float | None = Field(default=None, ge=0.0)
    mode: Mode | None = None
    # /config answers 429 with Retry-After for this many seconds from now (0: stop)
    config_429_s: float | None = Field(default=None, ge=0.0)
    # every request must carry x-hf-authorization: Bearer <token> ("": open again)
    require_token: str | None = None
    refuse_next: int | None = Field(default=None, ge=0)  # the next N joins: "Queue is full"


class _Misbehave:
    """Pure ASGI middleware: counts and delays ``/config``, refuses queue joins."""

    def __init__(self, app: ASGIApp, meter: _Meter) -> None:
        self.app = app
        self.meter = meter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            method: str = scope["method"]
            refusal = self._hub_refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
            if method == "GET" and path in CONFIG_PATHS:
                delay = self.meter.saw_config()
                if delay > 0:
                    await asyncio.sleep(delay)
            elif method == "GET" and path == APP_ID_PATH:
                with self.meter.lock:
                    failing = self.meter.mode == "probe_fail"
                if failing:
                    response = JSONResponse({"detail": "probe_fail mode"}, status_code=503)
                    await response(scope, receive, send)
                    return
            elif method == "POST" and path == QUEUE_JOIN_PATH:
                with self.meter.lock:
                    meter = self.meter
                    full = meter.mode == "queue_full" or meter.refuse_next > 0 or (
                        meter.no_queue is not None and meter.no_queue()
                    )
                    meter.refuse_next = max(0, meter.refuse_next - 1)
                    meter.refused += full
                if full:
                    response = JSONResponse({"detail": "Queue is full."}, status_code=503)
                    await response(scope, receive, send)
                    return
                await self.app(scope, receive, self._count_refusals(send))
                return
        await self.app(scope, receive, send)

    def _count_refusals(self, send: Send) -> Send:
        """``send`` that counts Gradio's own 503s of a queue join (``max_size`` full)."""
        meter = self.meter

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 503:
                with meter.lock:
                    meter.refused += 1
            await send(message)

        return counting

    def _hub_refusal(self, scope: Scope) -> JSONResponse | None:
        """What the Hub answers in front of a private or rate-limited Space: 401 without
        the token (``x-hf-authorization``, as gradio_client sends it), 429 with
        ``Retry-After`` on ``/config`` while rate limited."""
        path: str = scope["path"]
        if path.startswith("/_stand_in/"):
            return None
        meter = self.meter
        with meter.lock:
            if meter.token is not None:
                sent = dict(scope.get("headers", ())).get(b"x-hf-authorization", b"")
                if sent.decode(errors="replace") != f"Bearer {meter.token}":
                    meter.unauthorized += 1
                    return JSONResponse({"detail": "Unauthorized"}, status_code=401)
            if path in CONFIG_PATHS and time.time() < meter.config_429_until:
                meter.rate_limited += 1
                meter.config_requests += 1
                wait = max(1, math.ceil(meter.config_429_until - time.time()))
                return JSONResponse(
                    {"detail": "Too Many Requests"}, status_code=429,
                    headers={"Retry-After": str(wait)},
                )  # fmt: skip
        return None


def _kind_builder(kind: str) -> Callable[[_Meter, int, int | None], gr.Blocks]:
    if kind not in KINDS:
        raise ValueError(f"unknown stand-in kind {kind!r}; known: {', '.join(sorted(KINDS))}")
    module, _, function = KINDS[kind].partition(":")
    built: Callable[[_Meter, int, int | None], gr.Blocks] = getattr(
        importlib.import_module(module), function
    )
    return built


async def act_out(name: str, mode: Mode) -> None:
    """What the Space's mode asks of a call as it starts: raise a gr.Error, or hang."""
    if mode == "raise":
        raise gr.Error(f"{name}: raise mode")
    if mode == "hang":
        await asyncio.sleep(HANG_S)


def echo_fn(meter: _Meter) -> Callable[[str, float], Awaitable[str]]:
    """``/echo(text, delay_s)``, the text stand-in's endpoint every kind also has."""

    async def echo(text: str, delay_s: float) -> str:
        mode, started = meter.enter()
        try:
            await act_out(meter.name, mode)
            await asyncio.sleep(max(0.0, float(delay_s or 0)))
            return f"{meter.name}:{text}"
        finally:
            meter.leave(started, str(text))

    return echo


def echo_blocks(meter: _Meter, concurrency_limit: int, max_size: int | None) -> gr.Blocks:
    name = meter.name
    echo = echo_fn(meter)

    async def state(value: str, previous: str) -> tuple[str, str]:
        _, started = meter.enter()
        try:
            return previous, value
        finally:
            meter.leave(started)

    async def fail(text: str) -> str:
        raise gr.Error(f"failed: {text}")

    with gr.Blocks(title=f"stand-in Space {name}") as demo:
        text = gr.Textbox(label="text")
        delay = gr.Number(label="delay_s", value=0.0)
        out = gr.Textbox(label="output")
        session = gr.State("")
        gr.Button("echo").click(echo, [text, delay], out, api_name="echo")
        gr.Button("state").click(state, [text, session], [out, session], api_name="state")
        gr.Button("fail").click(fail, text, out, api_name="fail")
    demo.queue(default_concurrency_limit=concurrency_limit, max_size=max_size)
    blocks: gr.Blocks = demo
    return blocks


def _queue_sleeps_while_idle(queue: Any) -> None:
    """Gradio's queue loops (gradio 6.31's ``Queue.start_processing`` and
    ``start_progress_updates``), woken by work instead of ticking while there is none.

    Gradio's loop looks for an event to start every ``sleep_when_free`` (1 ms; the suite
    sets 10 ms), and its progress loop every 10 ms, whether or not anything waits or
    runs: ~0.6 % of a core per idle stand-in, and the suite keeps tens of them up for its
    whole run. Here, while no event waits, the loop sleeps until one joins the queue
    (``push`` sets ``arrived``); while no job runs, the progress loop sleeps until one
    starts (``process_events`` sets ``started``). With work in hand both are Gradio's own,
    step for step. Each looks at the queue and clears its wake-up with no ``await``
    between, so no arrival or start is missed; the waits are bounded (1 s), so a
    stopped queue's loops end. Other Gradio versions keep Gradio's own loops."""
    if gr.__version__ != "6.31.0":
        return
    from gradio.utils import run_coro_in_background, set_task_name

    arrived, started = asyncio.Event(), asyncio.Event()
    push, process_events = queue.push, queue.process_events

    async def push_and_wake(*args: Any, **kwargs: Any) -> Any:
        try:
            return await push(*args, **kwargs)
        finally:
            arrived.set()

    async def process_and_wake(*args: Any, **kwargs: Any) -> Any:
        started.set()
        return await process_events(*args, **kwargs)

    async def until(event: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), 1.0)

    async def start_processing() -> None:
        self = queue
        try:
            while not self.stopped:
                if len(self) == 0:
                    arrived.clear()
                    await until(arrived)
                    continue
                if None not in self.active_jobs:
                    await asyncio.sleep(self.sleep_when_free)
                    continue
                async with self.delete_lock:
                    event_batch = self.get_events()
                if event_batch:
                    events, batch, concurrency_id = event_batch
                    self.active_jobs[self.active_jobs.index(None)] = events
                    event_queue = self.event_queue_per_concurrency_id[concurrency_id]
                    event_queue.current_concurrency += 1
                    start_time = time.time()
                    fn = events[0].fn
                    event_queue.start_times_per_fn[fn].add(start_time)
                    for event in events:
                        if (a := self.event_analytics.get(event._id)) is not None:
                            a["status"] = "processing"
                    process_event_task = run_coro_in_background(
                        self.process_events, events, batch, start_time, fn
                    )
                    set_task_name(
                        process_event_task, events[0].session_hash, fn._id, events[0]._id, batch
                    )
                    self._asyncio_tasks.add(process_event_task)
                    process_event_task.add_done_callback(self._asyncio_tasks.discard)
                    if self.live_updates:
                        self.broadcast_estimations(concurrency_id)
                else:
                    await asyncio.sleep(self.sleep_when_free)
        finally:
            self.stopped = True
            self._cancel_asyncio_tasks()

    async def start_progress_updates() -> None:
        self = queue
        while not self.stopped:
            events = [evt for job in self.active_jobs if job is not None for evt in job]
            if len(events) == 0:
                started.clear()
                await until(started)
                continue
            for event in events:
                if event.progress_pending and event.progress:
                    event.progress_pending = False
                    self.send_message(event, event.progress)
            await asyncio.sleep(self.progress_update_sleep_when_free)

    queue.push, queue.process_events = push_and_wake, process_and_wake
    queue.start_processing, queue.start_progress_updates = start_processing, start_progress_updates


def build_space(
    name: str,
    *,
    config_delay_s: float = 0.0,
    concurrency_limit: int = 64,
    max_size: int | None = None,
    kind: str = "echo",
    login: bool = False,
) -> fastapi.FastAPI:
    """Build the ASGI app of one stand-in Space called ``name`` (serve it with uvicorn);
    ``login``: behind Gradio's own login, for the users of ``LOGIN_USERS``."""
    app = fastapi.FastAPI(title=f"stand-in Space {name}")
    # Placeholder app_id until the Blocks exists; replaced just below.
    meter = _Meter(name=name, app_id=0, config_delay_s=config_delay_s)
    demo = _kind_builder(kind)(meter, concurrency_limit, None if max_size == 0 else max_size)
    meter.app_id = int(demo.app_id)
    if max_size == 0:
        queue = demo._queue

        def no_room() -> bool:
            queues = queue.event_queue_per_concurrency_id.values()
            waiting = sum(len(q.queue) for q in queues)
            running = sum(q.current_concurrency for q in queues)
            return waiting + running >= concurrency_limit

        meter.no_queue = no_room
    # Gradio's queue polls every 1 ms while it is empty (gradio/queueing.py
    # ``sleep_when_free``): ~3 % of a core per idle stand-in. The test suite keeps tens of
    # them up at once on 2 cores, so it sets a longer poll (tests/conftest.py); anything
    # else (benchmarks, scripts/run) gets Gradio's own.
    # Under the same setting, while idle, the queue's loops sleep until there is work
    # (_queue_sleeps_while_idle): an idle stand-in costs ~0.1 % of a core, not ~0.6 %.
    if idle_poll_s := os.environ.get("DEVSPACES_IDLE_POLL_S"):
        demo._queue.sleep_when_free = float(idle_poll_s)
        _queue_sleeps_while_idle(demo._queue)

    @app.get("/_stand_in/stats")
    async def stats() -> dict[str, Any]:
        return meter.snapshot()

    @app.get("/_stand_in/intervals")
    async def intervals() -> list[tuple[float, float]]:
        with meter.lock:
            return list(meter.intervals)

    @app.get("/_stand_in/calls")
    async def calls() -> list[tuple[float, float, str]]:
        with meter.lock:
            return list(meter.calls)

    @app.post("/_stand_in/reset")
    async def reset() -> dict[str, Any]:
        meter.reset()
        return meter.snapshot()

    @app.post("/_stand_in/control")
    async def control(body: _Control) -> dict[str, Any]:
        with meter.lock:
            if body.config_delay_s is not None:
                meter.config_delay_s = body.config_delay_s
            if body.mode is not None:
                meter.mode = body.mode
            if body.config_429_s is not None:
                meter.config_429_s = body.config_429_s
                meter.config_429_until = time.time() + body.config_429_s
            if body.require_token is not None:
                meter.token = body.require_token or None
            if body.refuse_next is not None:
                meter.refuse_next = body.refuse_next
        return meter.snapshot()

    app.add_middleware(_Misbehave, meter=meter)
    mounted: fastapi.FastAPI = gr.mount_gradio_app(
        app, demo, path="/", run_history=False, ssr_mode=False,
        auth=list(LOGIN_USERS) if login else None,
    )  # fmt: skip
    return mounted
