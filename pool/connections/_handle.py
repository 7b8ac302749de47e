"""The leased handle a caller gets from ``get_client``: awaitable predict/submit.

A job is a :class:`~pool.transport.SpaceCall` of the connection's client (whichever
transport it is): an asyncio future for the result and two feeds that wake readers as
items arrive: the partial outputs (``async for out in
job.stream()``) and every protocol message as a typed event (``job.events()``). The
handle is detached when the lease ends (asyncpg): using it afterwards raises
:class:`~pool.MisuseError`.

Per-call headers (``submit(..., headers=...)``) go with that call's upstream requests
only (the native transport sends them on its join, data stream, upload, cancel and
download; the fallback on its join only, as gradio_client does).

Fencing: a handle knows the admission lease it runs under. When the lease is lost
(:meth:`~pool.admission.Lease.fence`: not renewed before its local expiry, or gone
from the store) the pool calls :meth:`PooledClient._fence`: every running job is
cancelled upstream, every ``await job`` raises :class:`~pool.LeaseLost` at once,
and ``submit`` refuses new work. Each await also checks the lease's local expiry
itself when it wakes, so a process resuming from a freeze stops before it goes on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from .._clock import SYSTEM_CLOCK, Clock
from .._exceptions import (
    DeadlineExceeded,
    InvalidRequest,
    LeaseLost,
    MisuseError,
    PoolClosedError,
    PoolError,
    UnknownEndpoint,
)
from ..admission import Lease
from ..resilience import Outcome
from ..transport import Classified, Feed, Relay, SpaceCall, SpaceClient, UpstreamEvent, classify
from . import _downloads
from ._cancels import deliver_cancel, first_attempt
from ._connection import Connection
from ._guard import check_outbound_off_loop
from ._pacing import JoinPacer

FailureHook = Callable[[Classified], bool]  # Failover.job_failed; True: a failover counted
_RESERVED = frozenset({"fn_index", "result_callbacks"})
DEFAULT_STREAM_KEEP = 32


@dataclass(frozen=True)
class Partial:
    """One output of a running job: its index (0, 1, ...) and its value."""

    index: int
    output: Any


class PooledJob:
    """One submitted job; ``await job``, ``await job.result(timeout=...)``,
    ``async for out in job.stream()`` or ``async for event in job.events()``."""

    def __init__(self, job: SpaceCall, handle: PooledClient, *, generator: bool = True) -> None:
        self._job = job
        self._handle = handle
        self._future: asyncio.Future[Any] = job.result
        self._cancelled = False
        self._generator = generator

    @property
    def done(self) -> bool:
        return self._future.done()

    @property
    def generator(self) -> bool:
        """Whether the endpoint is a generator: its outputs arrive one by one as partials
        (a plain endpoint has a single output, its result)."""
        return self._generator

    async def stream(self, timeout: float | None = None) -> AsyncGenerator[Any, None]:
        """Each output of the job as the Space sends it; ends after the final one.

        A generator endpoint's yields one by one (the last is the job's result); a plain
        endpoint's one result. Only the latest ``POOL_STREAM_KEEP`` outputs are kept: a
        reader that falls further behind skips older ones (never the latest or the
        final). Errors, ``timeout`` and cancellation behave as in :meth:`result`.
        """
        async with contextlib.aclosing(self.partials(timeout)) as partials:
            async for partial in partials:
                yield partial.output

    async def partials(self, timeout: float | None = None) -> AsyncGenerator[Partial, None]:
        """:meth:`stream` with each output's index (a gap: older outputs were skipped)."""
        async with contextlib.aclosing(self._follow(self._job.outputs, timeout)) as items:
            async for index, output in items:
                yield Partial(index, output)
        await self.result()  # done: its error, or the outcome "success"

    async def events(self, timeout: float | None = None) -> AsyncGenerator[UpstreamEvent, None]:
        """Every message the Space sends about this job, as it arrives, as a typed
        event (:class:`~pool.UpstreamQueued`, :class:`~pool.UpstreamStarted`,
        :class:`~pool.UpstreamProgress`, :class:`~pool.UpstreamLog`,
        :class:`~pool.UpstreamPartial`, :class:`~pool.UpstreamDone`); ends after the
        last. Does not raise the job's error (``await job`` does). The fallback
        transport has partials and done only."""
        async with contextlib.aclosing(self._follow(self._job.events, timeout)) as items:
            async for _, event in items:
                yield event

    async def _follow(
        self, feed: Feed, timeout: float | None
    ) -> AsyncGenerator[tuple[int, Any], None]:
        """The items of ``feed`` as they come, until it ends; lease, deadline and
        cancellation as in :meth:`result`."""
        started = self._handle.clock.now()
        index = 0
        while True:
            finished = feed.closed
            self._handle._check_lease()  # fenced, or resumed past its expiry: no more output
            first, items = feed.since(index)
            for i, item in enumerate(items, first):
                index = i + 1
                yield i, item
            if finished:
                return
            left = None if timeout is None else timeout - (self._handle.clock.now() - started)
            try:
                async with self._handle.clock.timeout(left):
                    await feed.wait(index)
            except TimeoutError:
                raise await self._deadline_passed(timeout, started) from None
            except asyncio.CancelledError:
                self._handle._dirty = True
                self._cancel_in_background()
                raise

    def status(self) -> Any:
        """gradio_client's status update (fallback transport only; see :meth:`events`)."""
        try:
            return self._job.status()
        except NotImplementedError:
            raise MisuseError("status() is the fallback transport's; use events()") from None

    async def result(self, timeout: float | None = None) -> Any:
        """The job's output; on ``timeout`` the upstream job is cancelled."""
        started = self._handle.clock.now()
        try:
            async with self._handle.clock.timeout(timeout):
                result = await self._handle._outcome(self._future)
        except LeaseLost:
            self._handle._dirty = True
            raise
        except TimeoutError:
            raise await self._deadline_passed(timeout, started) from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._future.done() and task is not None and not task.cancelling():
                # Not us being cancelled: the job's future was cancelled or raised
                # concurrent.futures.CancelledError (asyncio converts it) because the
                # Space dropped the job (killed or restarted mid-job).
                classified = classify(concurrent.futures.CancelledError())
                self._handle._failed(classified)
                raise classified.error from None
            self._handle._dirty = True
            self._cancel_in_background()
            raise
        except Exception as exc:
            if self._cancelled and self._handle._closing:
                raise PoolClosedError("the pool was closed while the job ran") from None
            if self._cancelled:
                raise DeadlineExceeded("the job was cancelled") from None
            classified = classify(exc)
            self._handle._failed(classified, self._job)
            raise classified.error from exc
        # Served; but after waiting for a worker in the Space's own queue (the Space's
        # own estimate, transport ``Call.congested``), which says our calls exceed its
        # concurrency.
        job = self._job
        self._handle.outcome = (
            "congested" if job.congested else "prompt" if job.prompt else "success"
        )
        pacer = self._handle._pacer
        if self._handle.outcome == "prompt":
            # A worker was free for it: the Space ran this many of ours at once, as its
            # own start and completion messages tell (connections/_pacing.py).
            self._handle.at = pacer.ran_with(job)
        elif self._handle.outcome == "congested":  # it held fewer than this many of ours
            self._handle.at = pacer.held_with(job) or self._handle.at
        return result

    @property
    def upstream_queue(self) -> tuple[int, int | None] | None:
        """(rank, queue size) the Space's queue gave this job before it started (the
        native transport; None before its ``estimation`` or on the fallback)."""
        rank = self._job.queue_rank
        return None if rank is None else (rank, self._job.queue_size)

    async def _deadline_passed(self, timeout: float | None, started: float) -> DeadlineExceeded:
        """Cancel the job upstream and return the error to raise."""
        self._handle._dirty = True
        await self.cancel()
        took = self._handle.clock.now() - started
        error = DeadlineExceeded(
            f"deadline of {timeout or 0:.1f}s passed after {took:.1f}s; "
            "the upstream job was cancelled"
        )
        self._handle._failed(Classified(error, False))
        return error

    async def cancel(self) -> None:
        """Cancel the job upstream (posts the Space's ``/cancel``)."""
        pending, unnamed = self._start_cancel()
        # A job the Space has not named yet is cancelled once it is, in the background:
        # a deadline is not held up by a slow join (the connection's close waits for it).
        if pending is not None and not unnamed:
            await first_attempt(pending)

    def _cancel_in_background(self) -> None:
        self._start_cancel()

    def _start_cancel(self) -> tuple[asyncio.Future[None] | None, bool]:
        """Start the upstream cancel (once), tracked on the connection so that closing
        it waits for the cancel; (None, _) if there is nothing to do."""
        if self._cancelled or self._future.done():
            return None, False
        self._cancelled = True
        self._handle._dirty = True
        unnamed = not self._job.named
        pending = asyncio.ensure_future(deliver_cancel(self._job))
        self._handle._track(pending)
        return pending, unnamed

    def __await__(self) -> Any:
        return self.result().__await__()


class PooledClient:
    """Exclusive use of one pooled connection to :attr:`space` for one request."""

    def __init__(
        self,
        conn: Connection,
        space: str,
        on_failure: FailureHook,
        *,
        guard: bool = False,
        lease: Lease | None = None,
        http: httpx.AsyncClient | None = None,
        file_max_bytes: int = 50 * 1024 * 1024,
        stream_keep: int = DEFAULT_STREAM_KEEP,
        clock: Clock = SYSTEM_CLOCK,
        pacer: JoinPacer | None = None,
    ) -> None:
        self._conn: Connection | None = conn
        self._pacer = pacer or JoinPacer()
        self._paced = False  # the last join waited for its turn (the Space was tight)
        self.clock = clock
        self._lease = lease
        self._fenced: asyncio.Future[None] | None = None
        self._http = http
        self.file_max_bytes = file_max_bytes
        self._guard = guard
        self._stream_keep = stream_keep
        self.space = space
        self._on_failure = on_failure
        self._jobs: list[PooledJob] = []
        self._dirty = False
        self._closing = False  # the pool is closing: its jobs were cancelled by aclose()
        self.broken = False
        self.failed_over = False  # a failure of this handle made the pool route around it
        # What the last job said about the Space's capacity (the adaptive window's
        # signal): success, a provider failure, or neutral (nothing learned).
        self.outcome: Outcome = "neutral"
        # Our calls at the Space when the last job was sent, itself included; for a
        # ``prompt`` job, those that ran there at once when it started (_pacing.py).
        self.at = 0

    @property
    def raw(self) -> SpaceClient:
        """The connection's client (escape hatch; do not keep it): a
        :class:`~pool.transport.SpaceClient`."""
        return self._live().client

    @property
    def api_names(self) -> list[str]:
        return self._live().client.api_names()

    def _live(self) -> Connection:
        if self._conn is None:
            raise MisuseError("this client handle was used after its lease ended")
        return self._conn

    async def submit(
        self,
        *args: Any,
        api_name: str | None = None,
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> PooledJob:
        """Start a job on the Space and return it without waiting for the result;
        ``headers`` go with this job's upstream requests only."""
        conn = self._live()
        self._check_lease()  # nothing new starts under a lost lease
        reserved = _RESERVED.intersection(kwargs)
        if reserved:
            # gradio_client's own parameters: fn_index would bypass the api_name check.
            raise InvalidRequest(f"reserved keyword(s) not allowed: {', '.join(sorted(reserved))}")
        if self._guard:
            # Linear, but a 512 KiB argument still takes tens of ms: large payloads are
            # checked in a worker thread, and the handle and lease are checked again after.
            await check_outbound_off_loop(args, kwargs)
            conn = self._live()
            self._check_lease()
        if api_name is not None:
            names = conn.client.api_names()
            if api_name not in names:
                raise UnknownEndpoint(api_name, names)
        self._paced = self._pacer.tight
        async with self._pacer.turn():  # a tight Space: one join at a time (_pacing.py)
            conn = self._live()
            try:
                job = conn.client.submit(api_name, args, kwargs, headers, self._stream_keep)
            except (ValueError, TypeError) as exc:
                raise InvalidRequest(f"cannot call {api_name or 'the endpoint'}: {exc}") from exc
            self.at = self._pacer.joined(job)
        pooled = PooledJob(job, self, generator=conn.client.is_generator(api_name))
        self._jobs.append(pooled)
        return pooled

    async def screen(self, data: list[Any]) -> None:
        """The outbound secret guard of this Space (as :meth:`submit` applies it) on
        a payload sent another way: the Gradio front's relayed events."""
        if self._guard:
            await check_outbound_off_loop(tuple(data), {})

    async def relay(
        self, fn_index: int, data: list[Any], relay: Relay,
        fields: Mapping[str, Any] | None = None,
    ) -> PooledJob:  # fmt: skip
        """:meth:`submit` for an event of the Gradio wire protocol as a client sent it
        (the Gradio front): the secret guard, then the join in the lease's session
        (:meth:`~pool.transport.SpaceClient.join_raw`), ``relay`` getting each raw
        message, ``fields`` the rest of the client's join body (``event_data``, ...).
        Returned once the Space named it; a failed join is fed to the pool
        (:meth:`report`) and raised as our error."""
        fields = dict(fields or {})
        await self.screen([*data, *fields.values()])
        conn = self._live()
        self._check_lease()
        try:
            job = await conn.client.join_raw(fn_index, data, relay, fields)
        except Exception as exc:
            raise self.report(exc) from exc
        pooled = PooledJob(job, self)
        self._jobs.append(pooled)
        return pooled

    async def predict(
        self,
        *args: Any,
        api_name: str | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run one job and return its result; ``timeout`` cancels it upstream."""
        job = await self.submit(*args, api_name=api_name, headers=headers, **kwargs)
        return await job.result(timeout=timeout)

    async def _outcome(self, future: asyncio.Future[Any]) -> Any:
        """``future``'s result, unless the lease is lost first (or was, on waking)."""
        lease = self._lease
        if lease is None:
            return await asyncio.shield(future)
        if self._fenced is None:
            self._fenced = asyncio.get_running_loop().create_future()
            if lease.lost is not None:
                self._fenced.set_result(None)
        await asyncio.wait((future, self._fenced), return_when=asyncio.FIRST_COMPLETED)
        self._check_lease()  # a frozen loop wakes up here: past the local expiry, fence first
        return future.result()

    def _check_lease(self) -> None:
        """Raise :class:`~pool.LeaseLost` if the lease is lost or past its local expiry."""
        if self._lease is not None:
            self._lease.check()

    def _fence(self, error: LeaseLost) -> None:
        """The lease is lost: cancel every running job upstream, wake every await."""
        self._dirty = True
        for job in self._jobs:
            job._cancel_in_background()
            job._job.outputs.poke()  # a partials() or events() reader wakes: LeaseLost
            job._job.events.poke()
        if self._conn is not None:
            # The data stream closed now, not when the connection goes: cut off, the
            # Space sees the disconnect as soon as packets flow again.
            self._conn.client.stop_streams()
        if self._fenced is not None and not self._fenced.done():
            self._fenced.set_result(None)

    async def download(
        self,
        value: Any,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """``value`` (a result) with every Gradio FileData in it downloaded into
        ``directory`` and replaced by a :class:`~pool.LocalFile`.

        Through this connection (its cookies; ``headers``: the call's), and once more on
        a fresh connection when a kept-alive one turns out closed; a body shorter than
        the ``size`` the Space announced is an error. Each file at most ``max_bytes``
        (default ``POOL_FILE_MAX_BYTES``), all of them within ``timeout`` seconds
        (:class:`~pool.DeadlineExceeded`). On any failure the files already fetched
        are deleted. Raises :class:`~pool.UpstreamFileError`.
        """
        found = _downloads.files_in(value)
        if not found:
            return value
        conn = self._live()
        limit = self.file_max_bytes if max_bytes is None else max_bytes
        fetched: dict[int, _downloads.LocalFile] = {}
        try:
            async with self.clock.timeout(timeout):
                for data in found:
                    if id(data) not in fetched:
                        fetched[id(data)] = await _downloads.fetch(
                            conn.client, data, directory, max_bytes=limit,
                            headers=headers, http=self._http,
                        )
        except BaseException as exc:
            for local in fetched.values():
                local.path.unlink(missing_ok=True)
            if isinstance(exc, TimeoutError):
                raise DeadlineExceeded("the deadline passed while fetching output files") from None
            raise
        return _downloads.replace_files(value, lambda data: fetched[id(data)])

    def _track(self, cancel: asyncio.Future[Any]) -> asyncio.Future[Any]:
        """Note a job cancel in flight: closing the connection waits for it."""
        if self._conn is not None:
            self._conn.cancels = [c for c in self._conn.cancels if not c.done()] + [cancel]
        return cancel

    def report(self, exc: BaseException) -> PoolError:
        """Feed the failure of work run on this lease outside :meth:`submit` (a relay
        on the connection's transport) to the pool as a job's own failure would be
        (connection, window, breaker, failover); returns the typed error."""
        classified = classify(exc)
        self._failed(classified)
        return classified.error

    def _failed(self, classified: Classified, call: SpaceCall | None = None) -> None:
        if classified.discard_connection:
            self.broken = True
        if classified.error.kind == "queue_full":
            # The Space's queue is full: the window comes down and its growth is held;
            # unless the join was not paced yet (maybe a burst's race, _pacing.py).
            self.outcome = "refused" if self._paced else "raced"
            self._pacer.tight = True
            if call is not None:  # it held fewer than this many of ours (_pacing.py)
                self.at = self._pacer.held_with(call) or self.at
        else:
            self.outcome = "failure" if classified.provider_failure else "neutral"
        self.failed_over = self._on_failure(classified) or self.failed_over

    def upstream_queue(self) -> tuple[int, int | None] | None:
        """The Space's queue as the last job that saw it reported it (rank, size)."""
        for job in reversed(self._jobs):
            if job.upstream_queue is not None:
                return job.upstream_queue
        return None

    def _cancel_jobs(self, *, closing: bool = False) -> None:
        """Cancel upstream every job of this handle that still runs (in the background);
        ``closing``: the pool is closing (the jobs' callers get PoolClosedError)."""
        self._closing = self._closing or closing
        for job in self._jobs:
            if not job.done:
                self._dirty = True
                job._cancel_in_background()

    def _detach(self) -> bool:
        """End the lease: cancel what still runs; True if the connection must go."""
        self._cancel_jobs()
        self._conn = None
        return self.broken or self._dirty
