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
import socket
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Mapping
from concurrent.futures import Executor
from typing import Any

import httpx

from ._exceptions import PoolClosedError
from ._tls import shared_ssl_context
from .transport import EVENTS_KEEP, Feed, UpstreamDone, UpstreamPartial, space_files_in

NAME_WAIT_S = 5.0  # longest wait for a just-submitted job's event id, to cancel it


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
    """The fallback factory (see :class:`GradioFactory`)."""
    return GradioFactory(
        token=token,
        connect_timeout_s=connect_timeout_s,
        read_timeout_s=read_timeout_s,
        max_workers=max_workers,
    )


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
        """Post the Space's ``/cancel`` from a worker thread (RuntimeError: the
        executor is shut down, the pool closed)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, _quiet_cancel, self._job)


def submit(
    client: Any, api_name: str | None, args: tuple[Any, ...], kwargs: Mapping[str, Any],
    headers: Mapping[str, str] | None, keep: int, executor: Executor,
) -> GradioJob:  # fmt: skip
    """Start a job on a Client (ValueError/TypeError as gradio_client raises them).

    gradio_client uploads every non-URL FileData from this host's disk: a
    :class:`~pool.transport.SpaceFile` (a caller's reference to a file on the Space)
    cannot be sent through it, so it is refused here (ValueError), never read."""
    if space_files_in(args) or space_files_in(dict(kwargs)):
        raise ValueError("a file already on the Space can be passed only with the native"
                         " transport (POOL_TRANSPORT=native)")  # fmt: skip
    extra = {"headers": dict(headers)} if headers else {}
    job = client.submit(*args, api_name=api_name, **extra, **kwargs)
    return GradioJob(job, executor, keep)


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
