"""The leased handle a caller gets from ``get_client``: awaitable predict/submit.

gradio_client is synchronous; its jobs already run in the Client's own threads, so a
job's ``concurrent.futures.Future`` is awaited with ``asyncio.wrap_future`` and the
event loop is never blocked. A job's partial outputs (a generator endpoint's yields)
are read as they arrive with ``async for out in job.stream()`` (:mod:`pool._streaming`
says how, without polling). The handle is detached when the lease ends (asyncpg):
using it afterwards raises :class:`~pool.MisuseError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from ._connection import Connection
from ._errors import Classified, classify
from ._exceptions import DeadlineExceeded, InvalidRequest, MisuseError, UnknownEndpoint
from ._guard import check_outbound
from ._streaming import Watch, watch
from .resilience import Outcome

FailureHook = Callable[[Classified], None]
_RESERVED = frozenset({"fn_index", "headers", "result_callbacks"})
DEFAULT_STREAM_KEEP = 32
NAME_WAIT_S = 5.0  # longest wait for a just-submitted job's event id, to cancel it


@dataclass(frozen=True)
class Partial:
    """One output of a running job: its index (0, 1, ...) and its value."""

    index: int
    output: Any


class PooledJob:
    """One submitted job; ``await job``, ``await job.result(timeout=...)`` or
    ``async for out in job.stream()``."""

    def __init__(
        self,
        job: Any,
        handle: PooledClient,
        *,
        generator: bool = True,
        keep: int = DEFAULT_STREAM_KEEP,
    ) -> None:
        self._job = job
        self._handle = handle
        self._future: asyncio.Future[Any] = asyncio.wrap_future(job.future)
        # A job given up on (deadline, cancel) still finishes with an error later;
        # mark it retrieved so asyncio does not log "exception was never retrieved".
        self._future.add_done_callback(_retrieve)
        self._cancelled = False
        self._generator = generator
        self._keep = keep
        self._watch: Watch | None = None

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
        started = time.monotonic()
        if self._watch is None:
            self._watch = watch(self._job, self._keep)
            if self._watch is not None:
                changed = self._watch.changed
                self._future.add_done_callback(lambda _: changed.set())
        w = self._watch
        if w is None:  # not a gradio_client Job: the result is the only output
            yield Partial(0, await self.result(timeout))
            return
        index = 0
        while True:
            finished = self._future.done()  # then every output is already appended
            w.changed.clear()
            first, outputs = w.since(index)
            for i, output in enumerate(outputs, first):
                index = i + 1
                yield Partial(i, output)
            if finished:
                break
            left = None if timeout is None else timeout - (time.monotonic() - started)
            try:
                async with asyncio.timeout(left):
                    await w.changed.wait()
            except TimeoutError:
                raise await self._deadline_passed(timeout, started) from None
            except asyncio.CancelledError:
                self._handle._dirty = True
                self._cancel_in_background()
                raise
        await self.result()  # done: its error, or the outcome "success"

    def status(self) -> Any:
        """gradio_client's status update (rank in the Space's queue, ETA, …)."""
        return self._job.status()

    async def result(self, timeout: float | None = None) -> Any:
        """The job's output; on ``timeout`` the upstream job is cancelled."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                result = await asyncio.shield(self._future)
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
            if self._cancelled:
                raise DeadlineExceeded("the job was cancelled") from None
            classified = classify(exc)
            self._handle._failed(classified)
            raise classified.error from exc
        self._handle.outcome = "success"
        return result

    async def _deadline_passed(self, timeout: float | None, started: float) -> DeadlineExceeded:
        """Cancel the job upstream and return the error to raise."""
        self._handle._dirty = True
        await self.cancel()
        error = DeadlineExceeded(
            f"deadline of {timeout or 0:.1f}s passed after {time.monotonic() - started:.1f}s; "
            "the upstream job was cancelled"
        )
        self._handle._failed(Classified(error, False))
        return error

    async def cancel(self) -> None:
        """Cancel the job upstream (posts the Space's ``/cancel``)."""
        pending = self._start_cancel()
        # A job the Space has not named yet is cancelled once it is, in the background:
        # a deadline is not held up by a slow join.
        if pending is not None and pending not in self._handle._unnamed:
            with contextlib.suppress(Exception):
                await pending

    def _cancel_in_background(self) -> None:
        self._start_cancel()

    def _start_cancel(self) -> asyncio.Future[None] | None:
        """Post the cancel from a worker thread (once); None if there is nothing to do."""
        if self._cancelled or self._future.done():
            return None
        self._cancelled = True
        self._handle._dirty = True
        unnamed = getattr(getattr(self._job, "communicator", None), "event_id", 1) is None
        loop = asyncio.get_running_loop()
        pending = loop.run_in_executor(self._handle._executor, _quiet_cancel, self._job)
        if unnamed:  # it waits for the Space to name the job; the connection's close too
            self._handle._unnamed.append(pending)
        return pending

    def __await__(self) -> Any:
        return self.result().__await__()


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _quiet_cancel(job: Any) -> None:
    """Cancel ``job`` upstream, in a worker thread; never raises.

    gradio_client's ``Job.cancel()`` posts the Space's ``/cancel`` with the event id it
    knows at that moment. Cancelled right after submit (a stream whose caller left at
    once), it knows none yet: the Space would run the job to its end. So wait (bounded)
    until the Space has named the job, then post the cancel again.
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


class PooledClient:
    """Exclusive use of one pooled connection to :attr:`space` for one request."""

    def __init__(
        self,
        conn: Connection,
        space: str,
        on_failure: FailureHook,
        executor: Executor,
        *,
        guard: bool = False,
        stream_keep: int = DEFAULT_STREAM_KEEP,
    ) -> None:
        self._conn: Connection | None = conn
        self._executor = executor
        self._guard = guard
        self._stream_keep = stream_keep
        self.space = space
        self._on_failure = on_failure
        self._jobs: list[PooledJob] = []
        self._unnamed: list[asyncio.Future[None]] = []  # cancels of jobs not yet named
        self._dirty = False
        self.broken = False
        # What the last job said about the Space's capacity (the adaptive window's
        # signal): success, a provider failure, or neutral (nothing learned).
        self.outcome: Outcome = "neutral"

    @property
    def raw(self) -> Any:
        """The underlying ``gradio_client.Client`` (escape hatch; do not keep it)."""
        return self._live().client

    @property
    def api_names(self) -> list[str]:
        return self._live().api_names()

    def _live(self) -> Connection:
        if self._conn is None:
            raise MisuseError("this client handle was used after its lease ended")
        return self._conn

    async def submit(self, *args: Any, api_name: str | None = None, **kwargs: Any) -> PooledJob:
        """Start a job on the Space and return it without waiting for the result."""
        conn = self._live()
        reserved = _RESERVED.intersection(kwargs)
        if reserved:
            # gradio_client's own parameters: fn_index would bypass the api_name check.
            raise InvalidRequest(f"reserved keyword(s) not allowed: {', '.join(sorted(reserved))}")
        if self._guard:
            check_outbound(args, kwargs)
        if api_name is not None:
            names = conn.api_names()
            if api_name not in names:
                raise UnknownEndpoint(api_name, names)
        try:
            job = conn.client.submit(*args, api_name=api_name, **kwargs)
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(f"cannot call {api_name or 'the endpoint'}: {exc}") from exc
        pooled = PooledJob(
            job, self, generator=conn.is_generator(api_name), keep=self._stream_keep
        )
        self._jobs.append(pooled)
        return pooled

    async def predict(
        self, *args: Any, api_name: str | None = None, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """Run one job and return its result; ``timeout`` cancels it upstream."""
        job = await self.submit(*args, api_name=api_name, **kwargs)
        return await job.result(timeout=timeout)

    def _failed(self, classified: Classified) -> None:
        if classified.discard_connection:
            self.broken = True
        self.outcome = "failure" if classified.provider_failure else "neutral"
        self._on_failure(classified)

    def _detach(self) -> bool:
        """End the lease: cancel what still runs; True if the connection must go."""
        for job in self._jobs:
            if not job.done:
                self._dirty = True
                job._cancel_in_background()
        if self._conn is not None:
            # A job cancelled right after submit still has its join on the way: closing
            # the Client now would shut its executors under it, the job would never
            # learn its event id and the Space would run it to the end, unwatched. The
            # connection's close waits (bounded) for those cancels (_quiet_cancel).
            self._conn.cancelling = [f for f in self._unnamed if not f.done()]
        self._conn = None
        return self.broken or self._dirty
