"""The request path above admission: one :meth:`RequestPath.predict`, all its attempts.

:class:`~pool.Pool` composes it: ``Attempts.lease`` (pool/_attempt.py) routes, wakes,
admits and checks out a connection for one attempt; this object runs a call over such
attempts — the retry policy (only where repeating is safe, preferably elsewhere),
the one deadline over queueing, retries and the call, the upstream cancel when it
passes, partial outputs to their reader (never retried once one was delivered), every
protocol event to its listener, the call's headers on every upstream request, and the
output files fetched while the slot is still held.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from ._clock import Clock
from ._consumer import current as current_consumer
from ._events import Hook, PoolEvent, emit
from ._exceptions import DeadlineExceeded, UpstreamTransportError
from ._sessions import PoolSession
from ._settings import PoolSettings
from ._trace import traced
from .admission import WaitTicket
from .connections import Partial, PooledClient, PooledJob
from .resilience import RetryPolicy
from .routing import classed_ticket, queue_timeout_for
from .transport import UpstreamEvent

_log = logging.getLogger("spacepool")
LeaseOpener = Callable[..., AbstractAsyncContextManager[PooledClient]]
"""``Attempts.lease``: one attempt's admission and connection."""


@dataclass(frozen=True)
class Prediction:
    """What :meth:`Pool.predict` returns."""

    space: str
    result: Any
    queued_ms: float
    duration_ms: float
    attempts: int


@dataclass(frozen=True)
class PredictOptions:
    """How one :meth:`Pool.predict <pool.Pool.predict>` runs: its keywords, in one object.

    A provider failure is retried (bounded, jittered backoff, preferably on another
    Space) when the Space never accepted the call, or when ``safe_to_retry`` says
    repeating it is harmless. ``timeout`` bounds the whole call, queueing and
    retries included: on expiry the upstream job is cancelled and
    :class:`DeadlineExceeded` raised. ``on_admitted(space)`` runs once a slot is held.
    ``download_to``: a folder; every file in the result is fetched into it while the
    slot is still held and appears in ``result`` as a :class:`~pool.LocalFile`
    (each at most ``POOL_FILE_MAX_BYTES``, all within ``POOL_FILE_TIMEOUT_S`` and
    the deadline).

    ``on_partial(partial)`` is awaited for each partial output of a generator
    endpoint as it arrives (:meth:`PooledJob.partials`; a reader slower than the
    Space skips older partials, never the latest); the result is the final output.
    Once a partial was delivered the call is never retried. ``headers`` go with
    every upstream request of this call (and no other); ``on_event(event)`` is
    awaited for each protocol message (:meth:`PooledJob.events`). ``session``: an
    open session (``Pool.open_session``) the call continues, on its Space.
    ``priority``: ``"interactive"`` (default) or ``"batch"`` (docs/scheduling.md); a
    batch call waits up to ``POOL_BATCH_QUEUE_TIMEOUT_S`` unless ``queue_timeout_s``
    is given.
    """

    email: str | None = None
    space: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    timeout: float | None = None
    queue_timeout_s: float | None = None
    safe_to_retry: bool = False
    ticket: WaitTicket | None = None
    on_admitted: Callable[[str], Awaitable[None]] | None = None
    download_to: str | os.PathLike[str] | None = None
    on_partial: Callable[[Partial], Awaitable[None]] | None = None
    headers: Mapping[str, str] | None = None  # sent with this call's upstream requests
    on_event: Callable[[UpstreamEvent], Awaitable[None]] | None = None
    session: str | PoolSession | None = None  # every attempt continues this session
    priority: str | None = None


@dataclass
class _Call:
    """One predict in flight: what to run and what it delivered so far."""

    api_name: str | None
    args: tuple[Any, ...]
    options: PredictOptions
    started: float
    deadline: float | None
    delivered: bool = False  # a partial reached the caller: never repeat the call
    failed: list[str] = field(default_factory=list)  # Spaces an attempt failed on
    handle: PooledClient | None = None  # the current attempt's, once admitted

    async def deliver(self, partial: Partial) -> None:
        self.delivered = True
        if self.options.on_partial is not None:
            await self.options.on_partial(partial)


async def _pump(job: PooledJob, on_event: Callable[[UpstreamEvent], Awaitable[None]]) -> None:
    """Deliver every event of ``job`` to ``on_event``, in order, until the job ends."""
    async with contextlib.aclosing(job.events()) as events:
        async for event in events:
            await on_event(event)



class RequestPath:
    """Runs calls over attempts that ``lease`` admits (see the module docstring)."""

    def __init__(
        self, lease: LeaseOpener, settings: PoolSettings, retry_policy: RetryPolicy,
        hooks: list[Hook], clock: Clock,
    ) -> None:  # fmt: skip
        self._lease = lease
        self.settings = settings
        self.retry_policy = retry_policy
        self.hooks = hooks
        self.clock = clock

    async def predict(
        self, api_name: str | None, args: tuple[Any, ...], options: PredictOptions
    ) -> Prediction:
        """One predict with the pool's retry policy, failover and deadline
        (:class:`PredictOptions` says what each option does)."""
        started = self.clock.now()
        timeout = options.timeout
        call = _Call(api_name, args, options, started,
                     None if timeout is None else started + timeout)  # fmt: skip
        ticket = classed_ticket(self.settings, options.ticket, _priority_of(options))
        queue_timeout = queue_timeout_for(self.settings, ticket, options.queue_timeout_s)
        attempt = 0
        while True:
            attempt += 1
            call.handle = None
            try:
                return await self._attempt(call, queue_timeout, ticket, attempt)
            except UpstreamTransportError as exc:
                await self._before_retry(exc, call, attempt)

    async def _attempt(
        self, call: _Call, queue_timeout: float, ticket: WaitTicket | None, attempt: int
    ) -> Prediction:
        """One attempt of ``call``: admission and a connection, then the call."""
        left = self._left(call.deadline)
        if left is not None and left <= 0:
            raise DeadlineExceeded("the deadline passed before the Space could be called")
        options = call.options
        queue_s = queue_timeout if left is None else min(queue_timeout, left)
        async with self._lease(
            options.email, options.space, queue_s, ticket, call.failed, left, call.api_name,
            options.session,
        ) as handle:
            call.handle = handle
            return await self._run_admitted(handle, call, attempt)

    async def _run_admitted(self, handle: PooledClient, call: _Call, attempt: int) -> Prediction:
        admitted = self.clock.now()
        if call.options.on_admitted is not None:
            await call.options.on_admitted(handle.space)
        left = self._left(call.deadline)
        if left is not None and left <= 0:
            raise DeadlineExceeded("the deadline passed while queued")
        result = await self._run(handle, call)
        return Prediction(
            space=handle.space,
            result=result,
            queued_ms=round((admitted - call.started) * 1000, 1),
            duration_ms=round((self.clock.now() - admitted) * 1000, 1),
            attempts=attempt,
        )

    async def _before_retry(self, exc: UpstreamTransportError, call: _Call, attempt: int) -> None:
        """Raise ``exc`` unless the retry policy repeats the call; then back off."""
        policy = self.retry_policy
        safe = call.options.safe_to_retry
        if call.delivered or not policy.should_retry(exc, attempt, safe_to_retry=safe):
            raise exc
        delay = policy.delay(attempt)
        if call.deadline is not None and self.clock.now() + delay >= call.deadline:
            raise exc
        handle = call.handle
        served = handle.space if handle is not None else None
        if served is not None:
            call.failed.append(served)
        emit(self.hooks, PoolEvent("retry", served, exc.kind))
        if call.options.space is None and not (handle is not None and handle.failed_over):
            # the next attempt is steered away from this Space (once per failure)
            emit(self.hooks, PoolEvent("failover", served, exc.kind))
        _log.info("retrying after %s on %s (attempt %d)", exc.kind, served, attempt)
        await self.clock.sleep(delay)

    def _left(self, deadline: float | None) -> float | None:
        return None if deadline is None else deadline - self.clock.now()

    async def _run(self, handle: PooledClient, call: _Call) -> Any:
        """``call`` on ``handle`` within its deadline: each partial output to its reader,
        each event to its listener, output files (partials' too) fetched into its folder."""
        options = call.options

        async def fetched(value: Any) -> Any:
            if options.download_to is None:
                return value
            rest, limit = self._left(call.deadline), self.settings.file_timeout_s
            timeout = limit if rest is None else min(limit, rest)
            files = handle.download(value, options.download_to, timeout=timeout,
                                    headers=options.headers)  # fmt: skip
            return await traced("spacepool.download", files)

        job = await handle.submit(*call.args, api_name=call.api_name, headers=options.headers,
                                  **options.kwargs)  # fmt: skip
        on_event = options.on_event
        pump = None if on_event is None else asyncio.create_task(_pump(job, on_event))
        try:
            if options.on_partial is not None and job.generator:
                left = self._left(call.deadline)
                async with contextlib.aclosing(job.partials(left)) as partials:
                    async for partial in partials:
                        output = await fetched(partial.output)
                        await call.deliver(dataclasses.replace(partial, output=output))
            result = await job.result(timeout=self._left(call.deadline))
            if pump is not None:
                await pump  # every event delivered (the job is done: they end)
        finally:
            if pump is not None and not pump.done():
                pump.cancel()
                with contextlib.suppress(BaseException):
                    await pump
        return await fetched(result)


def _priority_of(options: PredictOptions) -> str | None:
    """The class a call asks for, else its consumer's default (an API key's priority,
    pool/_consumer.py), else None (its ticket's class: interactive unless set)."""
    if options.priority is not None:
        return options.priority
    consumer = current_consumer()
    return None if consumer is None else consumer.priority
