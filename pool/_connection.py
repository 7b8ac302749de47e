"""One pooled connection: a ``gradio_client.Client`` plus the pool's bookkeeping.

A connection is exclusive to one request while leased. Opening and closing are
blocking (gradio_client is synchronous) and always run in worker threads.

Closing leaves nothing behind. A Client owns a heartbeat thread, three executors
and, while jobs run, a reader of the session's result stream; the heartbeat and the
reader sit in a blocking read that only a server message ends (a ping every 15 s), so
setting the kill flag alone leaves them alive for up to 15 s with their sockets open.
Each Client we open therefore gets a :class:`StreamCutter` as its httpx ``auth`` (the
one hook gradio_client passes to every httpx call it makes): it authenticates nothing
and follows the connections, so :func:`close_client` can shut the sockets its threads
are blocked on. The readers then see the stream end and return, the job helpers
waiting on them follow, a job waiting for a Space that does not answer fails at once,
and :func:`close_client` returns the Client's threads for the caller to wait for (they
end within milliseconds). What is left is a thread still connecting (a SYN with no
answer, bounded by the connect timeout) or resolving a host name.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import itertools
import os
import socket
import ssl
import threading
import weakref
from collections.abc import Callable, Generator
from typing import Any

import httpx

from ._exceptions import PoolClosedError

_ids = itertools.count(1)

ClientFactory = Callable[[str], Any]
"""Opens a ``gradio_client.Client`` (or a compatible object) for a source URL or id."""


class ConnState(enum.Enum):
    IDLE = "idle"  # ready, waiting in the Space's idle list
    LEASED = "leased"  # exclusive to one request
    CLOSED = "closed"  # closed or being closed; never handed out again


class Connection:
    """A Client with its Space, generation, probe failures and timestamps."""

    __slots__ = (
        "app_id",
        "cancels",
        "client",
        "created_at",
        "failures",
        "generation",
        "id",
        "last_used",
        "state",
        "used_by",
    )

    def __init__(self, client: Any, generation: int, now: float) -> None:
        self.id = next(_ids)
        self.client = client
        config = getattr(client, "config", None) or {}
        self.app_id: object = config.get("app_id")
        self.generation = generation
        self.created_at = self.last_used = now
        self.failures = 0
        self.state = ConnState.IDLE
        self.used_by: str | None = None
        # Job cancels (``/cancel`` requests) still in flight: closing waits for them,
        # as cutting the connections would stop them reaching the Space.
        self.cancels: list[asyncio.Future[Any]] = []

    def is_idle_longer_than(self, seconds: float, now: float) -> bool:
        return self.state is ConnState.IDLE and now - self.last_used >= seconds

    def is_healthy(self, max_failures: int) -> bool:
        return self.failures < max_failures

    def api_names(self) -> list[str]:
        """The Space's public ``api_name`` values, with the leading slash."""
        names = []
        for dep in (getattr(self.client, "config", None) or {}).get("dependencies", []):
            name = dep.get("api_name")
            if name and dep.get("api_visibility") != "private":
                names.append("/" + name)
        return names

    def is_generator(self, api_name: str | None) -> bool:
        """Whether ``api_name`` is a generator endpoint (streams partial outputs), from
        the Space's config; True when the config does not say."""
        for dep in (getattr(self.client, "config", None) or {}).get("dependencies", []):
            if api_name is not None and "/" + str(dep.get("api_name")) == api_name:
                return bool((dep.get("types") or {}).get("generator", True))
        return True

    def probe_url(self) -> str:
        """The cheap ``app_id`` endpoint of this connection's Space."""
        prefixed = str(getattr(self.client, "src_prefixed", "") or self.client.src)
        return prefixed.rstrip("/") + "/app_id"


def quiet_gradio_env() -> None:
    """No telemetry, no implicit token (GRADIO_FACTS.md)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """One TLS context for every connection.

    gradio_client passes ``verify=<bool>`` to each httpx call, which makes httpx load
    the CA bundle again for every request (30 % of a busy pool's CPU, and most of its
    memory, in scripts/bench). A context object is used as given. Honours
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` as httpx does.
    """
    cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    if cafile or capath:
        return ssl.create_default_context(cafile=cafile, capath=capath)
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


class StreamCutter(httpx.Auth):
    """An httpx auth flow that adds nothing to requests but follows the connections
    of one Client, so that :meth:`cut` can end the reads its threads are blocked in.

    It sets httpcore's ``trace`` extension on each request and keeps every network
    stream that connects (weakly): a stream being read (the heartbeat, the result
    stream) as well as one waiting for its response (a ``/queue/join`` or ``/config``
    to a Space that does not answer).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: weakref.WeakSet[Any] = weakref.WeakSet()
        self._cut = False

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.extensions = {**request.extensions, "trace": self._trace}
        yield request

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        if not event.endswith((".connect_tcp.complete", ".start_tls.complete")):
            return
        stream = info.get("return_value")
        if stream is None:
            return
        with self._lock:
            with contextlib.suppress(TypeError):  # a backend's stream without weakrefs
                self._streams.add(stream)
            cut = self._cut
        if cut:  # connected after the Client was closed: end it at once
            _shut(stream)

    def cut(self) -> None:
        """Shut every connection of the Client; later ones are shut as they connect."""
        with self._lock:
            self._cut = True
            streams = list(self._streams)
        for stream in streams:
            _shut(stream)


def _shut(stream: Any) -> None:
    """End a blocked read on ``stream``: the reader sees the connection end (an
    ``httpx.TransportError``, which gradio_client's readers take as end of stream).

    ``shutdown`` of the plain socket, not ``close``: closing an fd does not wake a
    thread blocked reading it, and ``SSLSocket.shutdown`` would tear the TLS object
    down under the reader. The read side only (``SHUT_RD``): the reader sees a clean
    end of stream (``RemoteProtocolError``, which gradio_client's result reader takes
    quietly), where a FIN to the server could draw a reset (``ReadError``, printed with
    its traceback). The reader's own ``with`` block then closes the socket. A socket
    already closed (or detached by TLS) has no fd any more: nothing to do.
    """
    sock = stream.get_extra_info("socket")
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RD)


class GradioFactory:
    """The default factory: a quiet Client with bounded threads and timeouts.

    Each Client gets its own :class:`StreamCutter`. The factory knows the Clients it
    is constructing, so a pool that closes meanwhile cuts their requests
    (:meth:`cut_opening`) instead of waiting for a slow Space's ``/config``.
    """

    def __init__(
        self, *, token: str | None, connect_timeout_s: float, read_timeout_s: float,
        max_workers: int,
    ) -> None:  # fmt: skip
        self._token = token
        self._timeout = httpx.Timeout(connect_timeout_s, read=read_timeout_s)
        self._max_workers = max_workers
        self._lock = threading.Lock()
        self._opening: set[StreamCutter] = set()
        self._cut = False

    def __call__(self, src: str) -> Any:
        from gradio_client import Client

        cutter = StreamCutter()
        with self._lock:
            if self._cut:
                raise PoolClosedError("pool closed")
            self._opening.add(cutter)
        try:
            return Client(
                src,
                token=self._token,
                max_workers=self._max_workers,
                verbose=False,
                download_files=False,
                analytics_enabled=False,
                ssl_verify=shared_ssl_context(),
                httpx_kwargs={"timeout": self._timeout, "auth": cutter},
            )
        finally:
            with self._lock:
                self._opening.discard(cutter)

    def cut_opening(self) -> None:
        """Make every Client under construction fail at once, and refuse new ones."""
        with self._lock:
            self._cut = True
            opening = list(self._opening)
        for cutter in opening:
            cutter.cut()


def gradio_factory(
    *, token: str | None, connect_timeout_s: float, read_timeout_s: float, max_workers: int
) -> GradioFactory:
    """The default factory (see :class:`GradioFactory`)."""
    return GradioFactory(
        token=token,
        connect_timeout_s=connect_timeout_s,
        read_timeout_s=read_timeout_s,
        max_workers=max_workers,
    )


def close_client(client: Any) -> list[threading.Thread]:
    """Really free a Client; returns its threads, which end promptly: wait for them.

    Stops the heartbeat (its kill flag: ``Client.close()`` would join it for up to 1 s
    for nothing), shuts the three executors down (queued work cancelled, idle workers
    exit) and cuts the connections its threads are blocked on (see the module
    docstring). Idempotent.
    """
    threads: list[threading.Thread] = []
    heartbeat = getattr(client, "heartbeat", None)
    if isinstance(heartbeat, threading.Thread) and heartbeat.is_alive():
        threads.append(heartbeat)
    try:
        kill = getattr(client, "_kill_heartbeat", None)
        if kill is not None:
            kill.set()
        elif (close := getattr(client, "close", None)) is not None:
            close()
    finally:
        for name in ("executor", "helper_executor", "stream_executor"):
            executor = getattr(client, name, None)
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)  # no new threads now
                threads.extend(getattr(executor, "_threads", ()))
        cutter = (getattr(client, "httpx_kwargs", None) or {}).get("auth")
        if isinstance(cutter, StreamCutter):
            cutter.cut()
    return threads
