"""The fallback transport: a synchronous ``gradio_client.Client`` per connection.

Used for a Space whose protocol :mod:`pool.transport` does not speak (Gradio 3's ``ws``
and ``sse``), with ``POOL_TRANSPORT=gradio_client``, and for a ``client_factory``
passed to :class:`~pool.Pool` (tests inject one). What this costs is why the native
transport exists: gradio_client's jobs run in its threads and its result poll sleeps
50 ms; per-call headers reach the queue join only; queue status is not an event.

Closing leaves nothing behind. A Client owns a heartbeat thread, three executors and,
while jobs run, a reader of the session's result stream; the heartbeat and the reader
sit in a blocking read that only a server message ends (a ping every 15 s). Each
Client we open therefore gets a :class:`StreamCutter` as its httpx ``auth`` (the one
hook gradio_client passes to every httpx call it makes): it authenticates nothing and
follows the connections, so :func:`close_client` can shut the sockets its threads are
blocked on; they then end within milliseconds.

Partial outputs (``utils.stream_sse_v1plus``): the job's worker thread appends each
full output value to ``Communicator.job.outputs`` under ``Communicator.lock``.
:class:`GradioJob` swaps that list for an :class:`_Outputs` (same contents; nothing in
gradio_client rebinds it) whose ``append`` hands the value to the event loop at once
(``call_soon_threadsafe``) and keeps only the latest ``keep``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Mapping
from concurrent.futures import Executor
from typing import Any

import httpx

from .._exceptions import PoolClosedError
from .._spaces import Login
from .._threads import wait_ended
from ._app import AppInfo, ProtocolNotSupported, named_endpoints
from ._events import UpstreamDone, UpstreamPartial
from ._feed import Feed
from ._files import Downloaded, download_to, file_url, safe_name, space_files_in
from ._interface import Relay, Replica, SpaceCall
from ._queue import EVENTS_KEEP
from ._space import SpaceTransport
from ._tls import shared_ssl_context

NAME_WAIT_S = 5.0  # longest wait for a just-submitted job's event id, to cancel it
_CLOSE_WAIT_S = 3.0  # a Client's threads end within ms once its sockets are cut
# A returned connection whose result stream is still closing (in gradio_client's thread)
# waits this long for it, in real time: the wait is for a thread, not on the pool's clock.
_SETTLE_S = 2.0
_SETTLE_POLL_S = 0.02
_DOWNLOAD_TIMEOUT = httpx.Timeout(10.0, read=60.0)  # per read; the caller bounds the whole
_log = logging.getLogger("spacepool")


class StreamCutter(httpx.Auth):
    """An httpx auth flow that adds nothing to requests but follows the connections
    of one Client, so that :meth:`cut` can end the reads its threads are blocked in."""

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
    """End a blocked read on ``stream``: ``shutdown(SHUT_RD)`` of the plain socket (a
    close would not wake the reader; a FIN could draw a reset); the reader's own
    ``with`` block then closes it. A socket already closed has no fd: nothing to do."""
    sock = stream.get_extra_info("socket")
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RD)


class GradioFactory:
    """Opens a quiet Client with bounded threads and timeouts, each with its own
    :class:`StreamCutter`; a pool that closes cuts the ones being constructed."""

    def __init__(
        self, *, token: str | None, connect_timeout_s: float, read_timeout_s: float,
        max_workers: int, logins: Mapping[str, Login] | None = None,
    ) -> None:  # fmt: skip
        self._token = token
        self._logins = dict(logins or {})  # by source: Client(auth=...) logs in (_login)
        self._timeout = httpx.Timeout(connect_timeout_s, read=read_timeout_s)
        self._max_workers = max_workers
        self._lock = threading.Lock()
        self._opening: set[StreamCutter] = set()
        self._cut = False

    def __call__(self, src: str) -> Any:
        from gradio_client import Client

        cutter = StreamCutter()
        login = self._logins.get(src)
        with self._lock:
            if self._cut:
                raise PoolClosedError("pool closed")
            self._opening.add(cutter)
        try:
            return Client(
                src,
                token=self._token,
                auth=(login.username, login.password) if login is not None else None,
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


def close_client(client: Any) -> list[threading.Thread]:
    """Really free a Client; returns its threads, which end promptly: wait for them.

    Stops the heartbeat (its kill flag), shuts the three executors down and cuts the
    connections its threads are blocked on. Idempotent.
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


class _Outputs(list[Any]):
    """A job's outputs: the latest ``keep`` of them, and a hand-off per append."""

    def __init__(self, items: Iterable[Any], keep: int, hand: Callable[[Any], None]) -> None:
        super().__init__(list(items)[-keep:])
        self.keep = keep
        self._hand = hand

    def append(self, item: Any) -> None:  # called by gradio_client, under its lock
        super().append(item)
        if len(self) > self.keep:
            del self[0]
        self._hand(item)


class GradioJob:
    """A gradio_client ``Job`` with the interface of :class:`pool.transport.Call`:
    ``result`` (an asyncio future), ``outputs`` and ``events`` feeds, ``cancel()``."""

    def __init__(self, job: Any, executor: Executor, keep: int) -> None:
        self._job = job
        self._executor = executor
        self.result: asyncio.Future[Any] = asyncio.wrap_future(job.future)
        self.result.add_done_callback(_retrieve)
        self.outputs = Feed(keep)
        self.events = Feed(EVENTS_KEEP)
        loop = asyncio.get_running_loop()

        def hand(item: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody listens
                loop.call_soon_threadsafe(self._output, item)

        communicator = getattr(job, "communicator", None)
        if communicator is not None:
            with communicator.lock:
                current = communicator.job.outputs
                for item in current:
                    self._output(item)
                communicator.job.outputs = _Outputs(current, keep, hand)
        # Outputs handed over before the result are on the loop's queue first.
        self.result.add_done_callback(self._finish)

    @property
    def done(self) -> bool:
        return self.result.done()

    @property
    def named(self) -> bool:
        return getattr(getattr(self._job, "communicator", None), "event_id", 1) is not None

    @property
    def congested(self) -> bool:
        return False  # gradio_client's status says nothing of the Space's own estimate

    @property
    def prompt(self) -> bool:
        return False  # (nor of a free worker)

    queue_rank: int | None = None  # the Space's queue is not an event here
    started_at: float | None = None  # (nor its start)
    queue_size: int | None = None

    @property
    def cancel_settled(self) -> bool:
        return True  # cancelled once (_quiet_cancel waits for the Space to name it)

    @property
    def reachable(self) -> bool:
        return False

    def status(self) -> Any:
        return self._job.status()

    def _output(self, item: Any) -> None:
        self.events.append(UpstreamPartial(self.outputs.total, item))
        self.outputs.append(item)

    def _finish(self, future: asyncio.Future[Any]) -> None:
        if self.outputs.total == 0 and not future.cancelled() and future.exception() is None:
            self._output(future.result())
        ok = not future.cancelled() and future.exception() is None
        self.events.append(UpstreamDone(ok))
        self.outputs.close()
        self.events.close()

    async def cancel(self) -> None:
        """Post the Space's ``/cancel`` from a worker thread (never raises)."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(RuntimeError):  # the executor is shut down: pool closed
            await loop.run_in_executor(self._executor, _quiet_cancel, self._job)

    async def send_cancel(self) -> None:
        await self.cancel()


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _quiet_cancel(job: Any) -> None:
    """Cancel ``job`` upstream, in a worker thread; never raises.

    ``Job.cancel()`` posts ``/cancel`` with the event id it knows at that moment;
    cancelled right after submit it knows none yet and the Space would run the job to
    its end. So wait (bounded) until the Space has named the job, then post again.
    """
    with contextlib.suppress(Exception):
        communicator = getattr(job, "communicator", None)
        named = getattr(communicator, "event_id", None) is not None
        job.cancel()
        cancel_fn = getattr(job, "cancel_fn", None)
        if named or communicator is None or cancel_fn is None:
            return
        deadline = time.monotonic() + NAME_WAIT_S
        while communicator.event_id is None and time.monotonic() < deadline:
            if job.future.done():
                break
            time.sleep(0.02)
        if communicator.event_id is not None:
            cancel_fn()


class FallbackClient:
    """A ``gradio_client.Client`` as a :class:`~pool.transport.SpaceClient`."""

    cancel_wait_s = NAME_WAIT_S + _CLOSE_WAIT_S

    def __init__(self, client: Any, executor: Executor) -> None:
        self.client = client  # the gradio_client.Client (escape hatch)
        self._executor = executor
        self._named = named_endpoints(getattr(client, "config", None) or {})

    @property
    def app_id(self) -> object:
        return (getattr(self.client, "config", None) or {}).get("app_id")

    @property
    def root(self) -> str:
        return str(getattr(self.client, "src_prefixed", "") or self.client.src).rstrip("/") + "/"

    def api_names(self) -> list[str]:
        return list(self._named)

    def is_generator(self, api_name: str | None) -> bool:
        endpoint = self._named.get(api_name or "")
        return True if endpoint is None else endpoint.generator

    def view_api(self) -> dict[str, Any]:
        info: dict[str, Any] = self.client.view_api(return_format="dict", print_info=False)
        return info

    def submit(
        self, api_name: str | None, args: tuple[Any, ...], kwargs: Mapping[str, Any],
        headers: Mapping[str, str] | None, keep: int,
    ) -> GradioJob:  # fmt: skip
        """Start a job (ValueError/TypeError as gradio_client raises them).

        gradio_client uploads every non-URL FileData from this host's disk: a
        :class:`~pool.transport.SpaceFile` (a caller's reference to a file on the Space)
        cannot be sent through it, so it is refused here (ValueError), never read."""
        if space_files_in(args) or space_files_in(dict(kwargs)):
            raise ValueError("a file already on the Space can be passed only with the native"
                             " transport (POOL_TRANSPORT=native)")  # fmt: skip
        extra = {"headers": dict(headers)} if headers else {}
        job = self.client.submit(*args, api_name=api_name, **extra, **kwargs)
        return GradioJob(job, self._executor, keep)

    def probe_headers(self) -> dict[str, str]:
        """The Client's own cookies from its ``/config``."""
        cookies = getattr(self.client, "cookies", None) or {}
        return {"cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())} if cookies else {}

    async def download(
        self, data: dict[str, Any], directory: str | os.PathLike[str], *, max_bytes: int,
        headers: Mapping[str, str] | None, http: httpx.AsyncClient | None,
    ) -> Downloaded:  # fmt: skip
        """The Client's headers and cookies, through ``http`` (or a client of its own)."""
        sent = {**(getattr(self.client, "headers", None) or {}), **(headers or {})}
        if cookies := getattr(self.client, "cookies", None) or {}:  # (per-request cookies=
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())  # is gone)
        name = safe_name(data.get("orig_name") or data["path"])
        url = file_url(self.root, data)
        async with contextlib.AsyncExitStack() as stack:
            if http is None:
                http = await stack.enter_async_context(httpx.AsyncClient())
            return await download_to(http, url, directory, name, max_bytes=max_bytes,
                                     headers=sent, timeout=_DOWNLOAD_TIMEOUT)  # fmt: skip

    def use_session(self, session_hash: str, replica: Replica) -> None:
        self.client.session_hash = session_hash  # its jobs carry client.session_hash

    async def replica_app_id(self, replica: Replica | None) -> tuple[object, Replica] | None:
        """The Client's own replica, as it opened (it keeps no cookies per session)."""
        return self.app_id, replica or ()

    def reset_session(self) -> None:
        reset = getattr(self.client, "reset_session", None)
        if reset is not None:
            reset()

    def settled(self) -> bool:
        return not getattr(self.client, "stream_open", False)

    async def settle(self) -> bool:
        """The result stream of the last lease closes in gradio_client's thread; a new
        session's jobs would get no reader until it does (docs/gradio-protocol.md §4).
        A thread's flag has no signal: looked at every 20 ms, in real time."""
        deadline = time.monotonic() + _SETTLE_S
        while not self.settled() and time.monotonic() < deadline:
            await asyncio.sleep(_SETTLE_POLL_S)
        return self.settled()

    def stop_streams(self) -> None:
        """Nothing to stop from here: the Client's threads end when it is closed."""

    async def join_raw(
        self, fn_index: int, data: list[Any], relay: Relay, fields: Mapping[str, Any]
    ) -> SpaceCall:
        raise ProtocolNotSupported("a gradio_client connection relays no raw event"
                                   " (POOL_TRANSPORT=native, Gradio 4+)")  # fmt: skip

    def wire(self) -> tuple[SpaceTransport, AppInfo]:
        raise ProtocolNotSupported("a gradio_client connection has no native wire"
                                   " (POOL_TRANSPORT=native, Gradio 4+)")  # fmt: skip

    async def aclose(self) -> None:
        """Cut the Client's sockets and wait (bounded) for its threads."""
        loop = asyncio.get_running_loop()
        threads = await loop.run_in_executor(self._executor, close_client, self.client)
        if left := await wait_ended(threads, _CLOSE_WAIT_S):  # the connect timeout ends them
            _log.warning("%d thread(s) of a closed connection still running", len(left))


class FallbackOpener:
    """Opens :class:`FallbackClient` objects: ``factory`` (a :class:`GradioFactory`, or
    a ``client_factory`` given to the pool) run in ``executor``."""

    def __init__(self, factory: Callable[[str], Any], executor: Executor) -> None:
        self._factory = factory
        self._executor = executor
        self._cut = False

    async def open(self, src: str) -> FallbackClient:
        loop = asyncio.get_running_loop()
        client = await loop.run_in_executor(self._executor, self._open_blocking, src)
        return FallbackClient(client, self._executor)

    def _open_blocking(self, src: str) -> Any:
        if self._cut:
            raise PoolClosedError("pool closed")
        client = self._factory(src)
        if self._cut:
            for thread in close_client(client):  # a worker thread: joining is fine here
                thread.join(_CLOSE_WAIT_S)
            raise PoolClosedError("pool closed while opening")
        return client

    def cut_opening(self) -> None:
        self._cut = True
        cut = getattr(self._factory, "cut_opening", None)  # a GradioFactory's
        if cut is not None:
            cut()

    async def aclose(self) -> None:
        """Nothing shared: each client closes its own threads."""


def quiet_gradio_env() -> None:
    """No telemetry, no implicit token (docs/hub.md, "Private Spaces": we send ours)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
