"""The native transport against real Gradio Spaces: per-call headers on every upstream
request of that call and no other's, typed events (queue, progress, gr.Info), file
downloads over closed keep-alive connections and short bodies, and the fallback."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from devspaces import SpaceProcess, free_port
from pool import (
    DeadlineExceeded,
    LocalFile,
    Pool,
    PoolSettings,
    UpstreamDone,
    UpstreamEvent,
    UpstreamLog,
    UpstreamProgress,
    UpstreamQueued,
    UpstreamStarted,
    file_arg,
)
from pool.transport import ShortBody, SpaceTransport

_HOP = {b"host", b"connection", b"transfer-encoding", b"keep-alive"}
_QUIET = ("/config", "/gradio_api/info", "/gradio_api/app_id")


class Recorder:
    """A reverse proxy in front of a Space that notes each request's method, path and
    ``x-caller`` header (what reached the Space, whoever at Gradio reads it)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.seen: list[tuple[str, str, str | None]] = []
        self.ports: list[int] = []  # each request's client port: its TCP connection
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(10, read=None))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        request = Request(scope, receive)
        self.seen.append((request.method, request.url.path, request.headers.get("x-caller")))
        self.ports.append(scope["client"][1])
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in _HOP]
        url = self.upstream + request.url.path + (f"?{request.url.query}" if request.url.query
                                                  else "")  # fmt: skip
        upstream = self.http.build_request(request.method, url, headers=headers,
                                           content=await request.body())  # fmt: skip
        response = await self.http.send(upstream, stream=True)
        try:
            out = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP]
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": out})  # fmt: skip
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    def calls(self, start: int, end: int | None = None) -> list[tuple[str, str, str | None]]:
        """The requests seen in ``[start:end]``, without the connection-level ones
        (config, API info, app_id probes), which belong to no call."""
        return [r for r in self.seen[start:end] if not r[1].startswith(_QUIET)]


@pytest.fixture(scope="module")
def space() -> Iterator[SpaceProcess]:
    with SpaceProcess("hdr", kind="headers") as process:
        yield process


@pytest.fixture
async def recorder(space: SpaceProcess) -> AsyncIterator[tuple[Recorder, str]]:
    async with recording(space.url) as got:
        yield got


@contextlib.asynccontextmanager
async def recording(upstream: str) -> AsyncIterator[tuple[Recorder, str]]:
    """A :class:`Recorder` in front of ``upstream``, served; (it, its URL)."""
    rec = Recorder(upstream)
    port = free_port()
    # A proxied heartbeat stream only notices its client left at its next ALIVE (15 s):
    # shutting down does not wait for it.
    server = uvicorn.Server(uvicorn.Config(rec, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=1))  # fmt: skip
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        assert not task.done(), "the recorder did not start"
        await asyncio.sleep(0.01)
    try:
        yield rec, f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        await task
        await rec.http.aclose()


def _pool(url: str, **extra: Any) -> Pool:
    return Pool(PoolSettings(spaces=f"hdr={url}", coordinator_url="memory://",
                             min_connections=1, max_connections=1, **extra))  # fmt: skip


async def test_a_calls_headers_reach_all_its_requests_and_no_other_calls(
    recorder: tuple[Recorder, str], tmp_path: Path
) -> None:
    """On one pooled connection used by alice then bob: alice's upload, join, data
    stream and download carry alice's header, bob's join and stream bob's; a deadline's
    cancel carries its caller's; no request carries another call's header."""
    rec, url = recorder
    pool = _pool(url)
    source = tmp_path / "in.txt"
    source.write_bytes(b"payload")
    try:
        await pool.predict("/echo", "warm", 0)  # the one connection opens
        alice_from = len(rec.seen)
        async with pool.client("alice@example.com") as client:
            connection = client.raw
            copied = await client.predict(file_arg(source), api_name="/copy",
                                          headers={"x-caller": "alice"})  # fmt: skip
            local = await client.download(copied, tmp_path / "out", headers={"x-caller": "alice"})
        bob_from = len(rec.seen)
        async with pool.client("bob@example.com") as client:
            assert client.raw is connection, "the same pooled connection, in turn"
            shown = await client.predict("b", 0, api_name="/headers", headers={"x-caller": "bob"})
        carol_from = len(rec.seen)
        with pytest.raises(DeadlineExceeded):
            await pool.predict("/headers", "c", 30, headers={"x-caller": "carol"}, timeout=1.0)
    finally:
        await pool.aclose()
    assert isinstance(local, LocalFile)
    assert local.read_bytes() == b"payload\ncaller=alice\n"
    assert shown["x-caller"] == "bob"
    alice, bob = rec.calls(alice_from, bob_from), rec.calls(bob_from, carol_from)
    carol = rec.calls(carol_from)
    kinds = {(m, "file" if "/file=" in p else p.rsplit("/", 1)[-1]) for m, p, _ in alice}
    assert {("POST", "upload"), ("POST", "join"), ("GET", "data"), ("GET", "file")} <= kinds
    assert {caller for *_, caller in alice} == {"alice"}, alice
    assert {("POST", "join"), ("GET", "data")} <= {(m, p.rsplit("/", 1)[-1]) for m, p, _ in bob}
    assert {caller for *_, caller in bob} == {"bob"}, bob
    assert ("POST", "/gradio_api/cancel", "carol") in carol, carol
    assert {caller for *_, caller in carol} == {"carol"}, carol
    # The connection-level requests carry nobody's headers.
    assert all(r[2] is None for r in rec.seen if r[1].startswith(_QUIET))


async def test_events_arrive_typed_queue_progress_and_log(space: SpaceProcess) -> None:
    """gr.Info/gr.Warning, gr.Progress and the queue's estimation reach the caller as
    typed events, in order, through on_event and PooledJob.events()."""
    pool = _pool(space.url)
    seen: list[UpstreamEvent] = []

    async def note(event: UpstreamEvent) -> None:
        seen.append(event)

    try:
        done = await pool.predict("/report", "x", 4, on_event=note)
        async with pool.client() as client:
            job = await client.submit("y", 2, api_name="/report")
            streamed = [event async for event in job.events()]
            assert await job == "done:y"
    finally:
        await pool.aclose()
    assert done.result == "done:x"
    kinds = [type(e) for e in seen]
    assert kinds[0] is UpstreamQueued and kinds[-1] is UpstreamDone
    assert kinds.index(UpstreamStarted) < kinds.index(UpstreamProgress)
    logs = [e for e in seen if isinstance(e, UpstreamLog)]
    assert [(e.level, e.message) for e in logs] == [("info", "info: x"), ("warning", "warning: x")]
    bars = [e for e in seen if isinstance(e, UpstreamProgress)]
    assert len(bars) == 4 and bars[-1].units[0].length == 4 and bars[-1].units[0].desc == "steps"
    assert bars[1].fraction == pytest.approx(0.25)
    assert seen[-1] == UpstreamDone(True)
    assert [type(e) for e in streamed].count(UpstreamProgress) == 2
    assert streamed[-1] == UpstreamDone(True)


class _FlakyFileServer:
    """A minimal Gradio-like HTTP server: ``/config`` and API info answered always; a
    ``file=`` request on a kept-alive connection that served a request before is met by
    closing the connection without an answer (as a server closing idle keep-alive
    connections does to a request that crossed its close); files ``body`` bytes long."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                path = head.split(b" ", 2)[1].decode()
                if "file=" in path and served:
                    return  # closed, no answer
                if path.startswith("/config"):
                    payload = (b'{"protocol": "sse_v3", "app_id": 1, "api_prefix": "/gradio_api",'
                               b' "dependencies": [], "components": []}')  # fmt: skip
                elif "file=" in path:
                    payload = self.body
                else:
                    payload = b'{"named_endpoints": {}, "unnamed_endpoints": {}}'
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
                             + f"content-length: {len(payload)}\r\n\r\n".encode() + payload)
                await writer.drain()
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def _flaky(body: bytes) -> AsyncIterator[tuple[_FlakyFileServer, str]]:
    flaky = _FlakyFileServer(body)
    server = await asyncio.start_server(flaky.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield flaky, f"http://127.0.0.1:{port}/"
    finally:
        server.close()
        await server.wait_closed()


async def test_a_download_over_a_closed_keep_alive_connection_is_sent_again(
    tmp_path: Path,
) -> None:
    """The kept-alive connection the download would reuse was closed by the server: the
    download is retried once, on a fresh connection, and gets the whole file."""
    meta = {"_type": "gradio.FileData"}
    async with _flaky(b"x" * 1000) as (flaky, url):
        space = SpaceTransport(url)
        try:
            await space.load()  # one kept-alive connection, used
            got = await space.download({"path": "/tmp/f.bin", "size": 1000, "meta": meta},
                                       tmp_path, max_bytes=10_000)  # fmt: skip
        finally:
            await space.aclose()
    assert got.path.read_bytes() == b"x" * 1000 and got.size == 1000
    assert flaky.connections == 2, "the retry went out on a fresh connection"


async def test_a_body_shorter_than_the_announced_size_is_an_error(tmp_path: Path) -> None:
    """A file whose body ends before the FileData's size is refused, nothing kept."""
    meta = {"_type": "gradio.FileData"}
    async with _flaky(b"x" * 100) as (_, url):
        space = SpaceTransport(url)
        try:
            with pytest.raises(ShortBody):
                await space.download({"path": "/tmp/f.bin", "size": 200, "meta": meta},
                                     tmp_path, max_bytes=10_000)  # fmt: skip
        finally:
            await space.aclose()
    assert not any(tmp_path.iterdir())  # noqa: ASYNC240


async def test_the_gradio_client_fallback_still_serves(space: SpaceProcess) -> None:
    """POOL_TRANSPORT=gradio_client: the same calls through a gradio_client.Client."""
    from gradio_client import Client

    from pool.transport import FallbackClient

    pool = _pool(space.url, transport="gradio_client")
    try:
        done = await pool.predict("/echo", "hi", 0)
        async with pool.client() as client:
            raw = client.raw
            assert isinstance(raw, FallbackClient) and isinstance(raw.client, Client)
            job = await client.submit("x", 0, api_name="/echo")
            assert [out async for out in job.stream()] == ["hdr:x"]
    finally:
        await pool.aclose()
    assert done.result == "hdr:hi"


async def test_the_job_events_carry_progress_and_log(space: SpaceProcess) -> None:
    """GET /api/jobs/{id}/events: a job's events carry the Space's gr.Progress (progress)
    and gr.Info/gr.Warning (log) as they happen; the final event is unchanged."""
    import json

    from app.main import create_app
    from pool import set_pool

    pool = _pool(space.url)
    set_pool(pool)
    application = create_app()
    lifespan = application.router.lifespan_context(application)
    await lifespan.__aenter__()
    try:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as http:
            made = await http.post("/api/jobs", json={"api_name": "/report", "args": ["j", 3]})
            assert made.status_code == 202, made.text
            seen: list[dict[str, Any]] = []
            async with http.stream("GET", f"/api/jobs/{made.json()['job_id']}/events") as got:
                async for line in got.aiter_lines():
                    if line.startswith("data:"):
                        seen.append(json.loads(line[5:]))
    finally:
        await lifespan.__aexit__(None, None, None)
        set_pool(None)
    assert seen[-1]["stage"] == "done" and seen[-1]["result"] == "done:j"
    logs = [e["log"] for e in seen if "log" in e]
    assert any(log["level"] == "info" and log["message"] == "info: j" for log in logs), seen
    bars = [e["progress"] for e in seen if "progress" in e]
    assert bars and bars[-1][0]["length"] == 3, seen
