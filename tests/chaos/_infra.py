"""What the chaos tests break: a private redis-server and a proxy that can cut a process off.

``PrivateRedis`` is a redis-server of the test's own on a free loopback port (no
persistence: a restart comes back empty), which the test may kill, restart, freeze
(SIGSTOP: the store stops answering, its state intact) and thaw. ``BlackHoleProxy``
sits between one process and Redis in the test's event loop; ``cut()`` makes it
swallow every byte both ways and accept new connections into the same void, which is
what a network partition looks like to the process (its commands time out).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis

from devspaces import free_port


class PrivateRedis:
    """A redis-server of our own, on a free port, that the test may kill and restart."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        server = shutil.which("redis-server")
        assert server, "redis-server is not installed"
        self.proc = subprocess.Popen(
            [server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 5
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "private redis-server did not start"
                time.sleep(0.02)
        client.close()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def freeze(self) -> None:
        """SIGSTOP: the server stops answering (connections hang), its state intact."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A private redis-server, killed at the end of the test."""
    if not shutil.which("redis-server"):
        if os.environ.get("CI"):
            pytest.fail("redis-server not installed; CI runs the Redis chaos tests")
        pytest.skip("redis-server not installed")
    server = PrivateRedis()
    server.start()
    yield server
    server.kill()


class BlackHoleProxy:
    """TCP proxy 127.0.0.1:``port`` → Redis; after :meth:`cut` nothing gets through."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.is_cut = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def cut(self) -> None:
        self.is_cut = True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        if self.is_cut:  # accepted into the void: read and drop until the client gives up
            await self._pump(reader, None)
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers.add(up_writer)
        back = asyncio.get_running_loop().create_task(self._pump(up_reader, writer))
        self._tasks.add(back)
        back.add_done_callback(self._tasks.discard)
        await self._pump(reader, up_writer)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None
    ) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                if writer is not None and not self.is_cut:
                    writer.write(data)
                    await writer.drain()
        if writer is not None:
            with contextlib.suppress(OSError):
                writer.close()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            with contextlib.suppress(OSError):
                writer.close()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            await self._server.wait_closed()
