"""A reverse proxy on 127.0.0.1 that spreads a client's requests over several service
processes: each kind of request (``queue/join``, ``queue/data``, ``heartbeat``, ``upload``,
``file=``, ``cancel``, ...) goes to the next backend in turn, and the kinds start on
different backends (a join's data stream is read from the other worker than the one
that took the join). What it sent where is kept (:attr:`SpreadProxy.sent`).

Streams are passed through as they come (no buffering), the ``Host`` header as the
client sent it (the services name the proxy in the URLs they answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from devspaces import free_port

# Where each kind starts: the data stream, heartbeat and cancel of a session's first
# event go to the other backend than its join.
_OFFSETS = {"join": 0, "data": 1, "heartbeat": 1, "cancel": 1, "upload": 0, "file": 1}
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "content-length"}


def kind_of(path: str) -> str:
    kinds = (("/queue/join", "join"), ("/queue/data", "data"), ("/heartbeat/", "heartbeat"),
             ("/cancel", "cancel"), ("/upload", "upload"), ("/file=", "file"),
             ("/config", "config"))  # fmt: skip
    for marker, kind in kinds:
        if marker in path:
            return kind
    return "other"


class SpreadProxy:
    """``with SpreadProxy([url_a, url_b]) as proxy:`` ``proxy.url`` spreads requests."""

    def __init__(self, backends: list[str]) -> None:
        self.backends = backends
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.sent: list[tuple[str, int]] = []  # (kind, backend index), in order
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        app = Starlette(routes=[Route("/{path:path}", self._forward,
                                      methods=["GET", "POST", "PUT", "DELETE"])],
                        lifespan=self._lifespan)  # fmt: skip
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical",
                                lifespan="on", loop="asyncio", http="h11",
                                timeout_graceful_shutdown=1)  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._http: httpx.AsyncClient | None = None

    def __enter__(self) -> SpreadProxy:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the spreading proxy did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=10.0))
        try:
            yield
        finally:
            await self._http.aclose()

    def reset(self) -> None:
        """Count each kind from zero again (the next join goes to the first backend)."""
        with self._lock:
            self._counts.clear()
            self.sent.clear()

    def served(self, kind: str) -> set[int]:
        """The backends that got a request of ``kind``."""
        with self._lock:
            return {b for k, b in self.sent if k == kind}

    def _pick(self, kind: str) -> int:
        with self._lock:
            n = self._counts.get(kind, 0)
            self._counts[kind] = n + 1
            backend = (n + _OFFSETS.get(kind, 0)) % len(self.backends)
            self.sent.append((kind, backend))
            return backend

    async def _forward(self, request: Request) -> StreamingResponse:
        assert self._http is not None  # made on the proxy's own loop, at start
        kind = kind_of(request.url.path)
        target = self.backends[self._pick(kind)] + request.url.path
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        upstream = self._http.build_request(
            request.method, target, params=request.query_params, headers=headers,
            content=await request.body(),
        )  # fmt: skip
        response = await self._http.send(upstream, stream=True)
        out = [(k, v) for k, v in response.headers.items() if k.lower() not in _HOP]
        return StreamingResponse(
            _body(response), status_code=response.status_code, headers=dict(out),
            background=BackgroundTask(response.aclose),
        )  # fmt: skip


async def _body(response: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    except (httpx.HTTPError, asyncio.CancelledError):
        return
