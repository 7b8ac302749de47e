"""The leased handle a caller gets from ``get_client``: awaitable predict/submit.

gradio_client is synchronous; its jobs already run in the Client's own threads, so a
job's ``concurrent.futures.Future`` is awaited with ``asyncio.wrap_future`` and the
event loop is never blocked. The handle is detached when the lease ends (asyncpg):
using it afterwards raises :class:`~pool.MisuseError`.

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
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import httpx

from . import _files
from ._connection import Connection
from ._errors import Classified, classify
from ._exceptions import (
    DeadlineExceeded,
    InvalidRequest,
    LeaseLost,
    MisuseError,
    UnknownEndpoint,
)
from ._guard import check_outbound
from .admission import Lease
from .resilience import Outcome

FailureHook = Callable[[Classified], None]
_RESERVED = frozenset({"fn_index", "headers", "result_callbacks"})


class PooledJob:
    """One submitted job; ``await job`` or ``await job.result(timeout=...)``."""

    def __init__(self, job: Any, handle: PooledClient) -> None:
        self._job = job
        self._handle = handle
        self._future: asyncio.Future[Any] = asyncio.wrap_future(job.future)
        # A job given up on (deadline, cancel) still finishes with an error later;
        # mark it retrieved so asyncio does not log "exception was never retrieved".
        self._future.add_done_callback(_retrieve)
        self._cancelled = False

    @property
    def done(self) -> bool:
        return self._future.done()

    def status(self) -> Any:
        """gradio_client's status update (rank in the Space's queue, ETA, …)."""
        return self._job.status()

    async def result(self, timeout: float | None = None) -> Any:
        """The job's output; on ``timeout`` the upstream job is cancelled."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                result = await self._handle._outcome(self._future)
        except LeaseLost:
            self._handle._dirty = True
            raise
        except TimeoutError:
            self._handle._dirty = True
            await self.cancel()
            error = DeadlineExceeded(
                f"deadline of {timeout:.1f}s passed after {time.monotonic() - started:.1f}s; "
                "the upstream job was cancelled"
            )
            self._handle._failed(Classified(error, False))
            raise error from None
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

    async def cancel(self) -> None:
        """Cancel the job upstream (posts the Space's ``/cancel``)."""
        if self._cancelled or self._future.done():
            return
        self._cancelled = True
        self._handle._dirty = True
        loop = asyncio.get_running_loop()
        with contextlib.suppress(Exception):
            cancel = loop.run_in_executor(self._handle._executor, self._job.cancel)
            await self._handle._track(cancel)

    def _cancel_in_background(self) -> None:
        if not self._cancelled and not self._future.done():
            self._cancelled = True
            loop = asyncio.get_running_loop()
            # RuntimeError: the pool is closed (its executor shut down), and closing
            # the connection already cut the job's stream, which drops it upstream.
            with contextlib.suppress(RuntimeError):
                self._handle._track(
                    loop.run_in_executor(self._handle._executor, _quiet_cancel, self._job)
                )

    def __await__(self) -> Any:
        return self.result().__await__()


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _quiet_cancel(job: Any) -> None:
    with contextlib.suppress(Exception):
        job.cancel()


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
        lease: Lease | None = None,
        http: httpx.AsyncClient | None = None,
        file_max_bytes: int = 50 * 1024 * 1024,
    ) -> None:
        self._conn: Connection | None = conn
        self._lease = lease
        self._fenced: asyncio.Future[None] | None = None
        self._http = http
        self.file_max_bytes = file_max_bytes
        self._executor = executor
        self._guard = guard
        self.space = space
        self._on_failure = on_failure
        self._jobs: list[PooledJob] = []
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
        if self._lease is not None:
            self._lease.check()  # nothing new starts under a lost lease
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
        pooled = PooledJob(job, self)
        self._jobs.append(pooled)
        return pooled

    async def predict(
        self, *args: Any, api_name: str | None = None, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """Run one job and return its result; ``timeout`` cancels it upstream."""
        job = await self.submit(*args, api_name=api_name, **kwargs)
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
        lease.check()  # a frozen loop wakes up here: past the local expiry, fence first
        return future.result()

    def _fence(self, error: LeaseLost) -> None:
        """The lease is lost: cancel every running job upstream, wake every await."""
        self._dirty = True
        for job in self._jobs:
            job._cancel_in_background()
        if self._fenced is not None and not self._fenced.done():
            self._fenced.set_result(None)

    async def download(
        self,
        value: Any,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        timeout: float | None = None,
    ) -> Any:
        """``value`` (a result) with every Gradio FileData in it downloaded into
        ``directory`` and replaced by a :class:`~pool.LocalFile`.

        Through this connection's headers and cookies; each file at most ``max_bytes``
        (default ``POOL_FILE_MAX_BYTES``), all of them within ``timeout`` seconds
        (:class:`~pool.DeadlineExceeded`). On any failure the files already fetched
        are deleted. Raises :class:`~pool.UpstreamFileError`.
        """
        found = _files.files_in(value)
        if not found:
            return value
        conn = self._live()
        limit = self.file_max_bytes if max_bytes is None else max_bytes
        fetched: dict[int, _files.LocalFile] = {}
        own_http = self._http is None
        http = self._http or httpx.AsyncClient()
        try:
            async with asyncio.timeout(timeout):
                for data in found:
                    if id(data) not in fetched:
                        fetched[id(data)] = await _files.fetch(
                            http, conn.client, data, directory, max_bytes=limit
                        )
        except BaseException as exc:
            for local in fetched.values():
                local.path.unlink(missing_ok=True)
            if isinstance(exc, TimeoutError):
                raise DeadlineExceeded("the deadline passed while fetching output files") from None
            raise
        finally:
            if own_http:
                await http.aclose()
        return _files.replace_files(value, lambda data: fetched[id(data)])

    def _track(self, cancel: asyncio.Future[Any]) -> asyncio.Future[Any]:
        """Note a job cancel in flight: closing the connection waits for it."""
        if self._conn is not None:
            self._conn.cancels = [c for c in self._conn.cancels if not c.done()] + [cancel]
        return cancel

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
        self._conn = None
        return self.broken or self._dirty
