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
* modes ``hang`` and ``raise`` are read by ``/echo`` itself when a call starts.

The event functions are coroutines: they run on the server's event loop, not in the
anyio worker-thread pool (40 threads by default), so a hundred hanging calls cost no
threads. Every counter sits behind one ``threading.Lock`` anyway, so the numbers stay
right if a function is ever made synchronous.
"""

from __future__ import annotations

import asyncio
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

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        # (start, end) wall-clock times of finished calls, so that a test can compute
        # the concurrency of several Spaces together (they share the host's clock).
        self.intervals: list[tuple[float, float]] = []

    def enter(self) -> tuple[Mode, float]:
        """Count a call that starts; return the mode it must obey and its start time."""
        with self.lock:
            self.in_flight += 1
            self.total += 1
            self.peak = max(self.peak, self.in_flight)
            return self.mode, time.time()

    def leave(self, started: float) -> None:
        """Count a call that ended, however it ended."""
        with self.lock:
            self.in_flight -= 1
            if len(self.intervals) < MAX_INTERVALS:
                self.intervals.append((started, time.time()))

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


class _Control(BaseModel):
    """Body of ``POST /_stand_in/control``; absent fields are left unchanged."""

    config_delay_s: float | None = Field(default=None, ge=0.0)
    mode: Mode | None = None
    # /config answers 429 with Retry-After for this many seconds from now (0: stop)
    config_429_s: float | None = Field(default=None, ge=0.0)
    # every request must carry x-hf-authorization: Bearer <token> ("": open again)
    require_token: str | None = None


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
                    full = self.meter.mode == "queue_full"
                    self.meter.refused += full
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


# Kinds of stand-in Space: kind -> "module:function", the function building the Blocks
# from (meter, concurrency_limit, max_size). Imported lazily, so a kind's own module may
# import this one (for _Meter). "echo" is the text stand-in every older test uses.
KINDS: dict[str, str] = {
    "echo": "devspaces._app:echo_blocks",
    "image": "devspaces._media:image_blocks",
    "stream": "devspaces._streaming:stream_blocks",
    "chat": "devspaces._streaming:chat_blocks",
    "headers": "devspaces._headers:headers_blocks",
    "shapes": "devspaces._shapes:shapes_blocks",
    "zerogpu": "devspaces._zerogpu:zerogpu_blocks",
    "upper": "devspaces._demos:upper_blocks",
    "state": "devspaces._demos:state_blocks",
    "filename": "devspaces._demos:filename_blocks",
}


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
            meter.leave(started)

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


def build_space(
    name: str,
    *,
    config_delay_s: float = 0.0,
    concurrency_limit: int = 64,
    max_size: int | None = None,
    kind: str = "echo",
) -> fastapi.FastAPI:
    """Build the ASGI app of one stand-in Space called ``name`` (serve it with uvicorn)."""
    app = fastapi.FastAPI(title=f"stand-in Space {name}")
    # Placeholder app_id until the Blocks exists; replaced just below.
    meter = _Meter(name=name, app_id=0, config_delay_s=config_delay_s)
    demo = _kind_builder(kind)(meter, concurrency_limit, max_size)
    meter.app_id = int(demo.app_id)
    # Gradio's queue polls every 1 ms while it is empty (gradio/queueing.py
    # ``sleep_when_free``): ~3 % of a core per idle stand-in. The test suite keeps tens of
    # them up at once on 2 cores, so it sets a longer poll (tests/conftest.py); anything
    # else (benchmarks, scripts/run) gets Gradio's own.
    if idle_poll_s := os.environ.get("DEVSPACES_IDLE_POLL_S"):
        demo._queue.sleep_when_free = float(idle_poll_s)

    @app.get("/_stand_in/stats")
    async def stats() -> dict[str, Any]:
        return meter.snapshot()

    @app.get("/_stand_in/intervals")
    async def intervals() -> list[tuple[float, float]]:
        with meter.lock:
            return list(meter.intervals)

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
        return meter.snapshot()

    app.add_middleware(_Misbehave, meter=meter)
    mounted: fastapi.FastAPI = gr.mount_gradio_app(
        app, demo, path="/", run_history=False, ssr_mode=False
    )
    return mounted
