"""Request heads are bounded before any auth (issue 38, F4), on every way the project
starts the service: a 32 MiB header is refused (431, or the connection closed) without
the process's memory growing; a header line over 16 KiB or a head over 64 KiB is a 431;
an ordinary request is served as before. ``python -m app`` (and ``scripts/run``, which
runs it) and the test services (the Dockerfile's ``--http``) are both run here."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from app._http import HEAD_MAX_BYTES, LINE_MAX_BYTES, PROTOCOL
from devspaces import SpaceFleet, free_port
from tests.service.conftest import ROOT, ServiceFactory, service_env, tls

MiB = 1024 * 1024


async def _send_head(port: int, head: bytes) -> int | None:
    """Send ``head`` (then the blank line) and read the status; None: the connection
    was closed before an answer could be read (the refusal of a huge head)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        with contextlib.suppress(ConnectionError):
            for start in range(0, len(head), 256 * 1024):
                writer.write(head[start : start + 256 * 1024])
                await writer.drain()
            writer.write(b"\r\n")
            await writer.drain()
        try:
            line = await asyncio.wait_for(reader.readline(), 30)
        except ConnectionError:
            return None
        return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else None
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def _head(*headers: bytes) -> bytes:
    return b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(
        h + b"\r\n" for h in headers
    )


async def _assert_bounded(port: int, pid: int) -> None:
    ok = await _send_head(port, _head())
    assert ok == 200
    rss = psutil.Process(pid).memory_info().rss
    huge = await _send_head(port, _head(b"X-Big: " + b"a" * (32 * MiB)))
    assert huge in (431, None), huge
    grown = psutil.Process(pid).memory_info().rss - rss
    assert grown < 8 * MiB, f"RSS grew by {grown / MiB:.1f} MiB"
    assert await _send_head(port, _head(b"X-Line: " + b"a" * (LINE_MAX_BYTES + 1))) == 431
    many = [b"X-H%d: " % i + b"a" * (LINE_MAX_BYTES - 64) for i in range(5)]
    assert sum(len(h) for h in many) > HEAD_MAX_BYTES  # each line within its bound
    assert await _send_head(port, _head(*many)) in (431, None)  # None: closed at once
    assert await _send_head(port, _head(b"X-Fine: " + b"a" * 4096)) == 200


async def test_f4_the_test_services_head_is_bounded(
    start_service: ServiceFactory, fleet: SpaceFleet
) -> None:
    """uvicorn with the Dockerfile's ``--http`` (what the test services run)."""
    service = start_service()
    await _assert_bounded(service.port, service.proc.pid)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"--http {PROTOCOL}" in dockerfile


@pytest.fixture
def python_m_app(fleet: SpaceFleet, tmp_path: Path) -> Iterator[tuple[int, int]]:
    """``python -m app`` over the fleet (scripts/run execs it): its port and pid."""
    port = free_port()
    env = service_env(fleet, tmp_path)
    log = (tmp_path / "app.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "app", "--port", str(port)], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp_path / "app.log").read_text()[-2000:]
            with contextlib.suppress(httpx.TransportError):
                healthz = f"http://127.0.0.1:{port}/healthz"
                if httpx.get(healthz, timeout=1, verify=tls()).status_code == 200:
                    break
            assert time.monotonic() < deadline, "python -m app did not answer"
            time.sleep(0.1)
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


async def test_f4_python_m_app_bounds_the_head(python_m_app: tuple[int, int]) -> None:
    """``python -m app`` (``scripts/run``): the same bounds."""
    await _assert_bounded(*python_m_app)


async def test_f11_a_client_leaving_mid_body_is_no_500_and_its_call_is_given_back(
    start_service: ServiceFactory, fleet: SpaceFleet
) -> None:
    """A key with daily_calls=1 sends half a predict body and leaves: no 500 or
    traceback in the log, and the call is given back — the key's one call of the day
    still runs (before: logged 500 with a traceback, the call spent)."""
    from tests.service.conftest import admin_headers

    service = start_service()
    async with service.client(**admin_headers()) as admin:
        made = await admin.post("/api/admin/keys",
                                json={"name": "leaver", "max_concurrent": 1, "daily_calls": 1})
    key = made.json()["key"]
    _, writer = await asyncio.open_connection("127.0.0.1", service.port)
    writer.write(b"POST /api/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + key.encode() + b"\r\n"
                 b"Content-Length: 100000\r\n\r\n" + b'{"api_name": "/echo", ')
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    async with service.client(Authorization=f"Bearer {key}") as http:
        async def answered() -> bool:
            done = await http.post("/api/predict",
                                   json={"api_name": "/echo", "args": ["back", 0]})
            assert done.status_code in (200, 429), done.text
            return done.status_code == 200

        deadline = time.monotonic() + 10  # the server learns of the leaving at its pace
        while not await answered():
            assert time.monotonic() < deadline, "the abandoned call was never given back"
            await asyncio.sleep(0.2)
    log = service.log_text()
    assert "Traceback" not in log and '"status": 500' not in log, log[-3000:]
