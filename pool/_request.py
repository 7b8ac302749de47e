"""The request path above admission: one :meth:`RequestPath.predict`, all its attempts.

:class:`~pool.Pool` composes it: ``Attempts.lease`` (pool/_attempt.py) routes, wakes,
admits and checks out a connection for one attempt; this object runs a call over such
attempts — the retry policy (only where repeating is safe, preferably elsewhere),
the one deadline over queueing, retries and the call, the upstream cancel when it
passes, partial outputs to their reader (never retried once one was delivered), every
protocol event to its listener, the call's headers on every upstream request, and the
output files fetched while the slot is still held.

One request path for every face: a call is a sequence of attempts (:class:`Calls`, an
async iterator of :class:`CallAttempt`), and what happens between two is decided in one
place (:meth:`RequestPath._again`): a refusal for want of room (the Space's own queue
full) waits in the pool's queue again until the queue timeout, counted from the call's
start; a failure the retry policy repeats is repeated after its backoff; anything else
is raised. :meth:`RequestPath.predict` runs a predict on each attempt;
:meth:`Pool.call <pool.Pool.call>` hands the attempts to a caller that runs its own
work on them (the Gradio front relays a client's event), under the same rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
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
_REQUEUE_LAST_S = 0.05  # less left than this before the queue timeout: the refusal stands
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
    """One call in flight: what to run, its clocks, and what it delivered so far."""

    api_name: str | None
    args: tuple[Any, ...]
    options: PredictOptions
    started: float
    deadline: float | None
    queue_timeout: float = 0.0
    ticket: WaitTicket | None = None
    delivered: bool = False  # a partial reached the caller: never repeat the call
    failed: list[str] = field(default_factory=list)  # Spaces an attempt failed on
    handle: PooledClient | None = None  # the current attempt's, once admitted
    attempts: int = 0  # attempts the retry policy counts (refusals for want of room not)
    refusals: int = 0  # refusals for want of room (RetryPolicy.should_requeue)
    queue_by: float | None = None  # once refused for want of room: its waits end here
    error: Exception | None = None  # what the last attempt raised

    async def deliver(self, partial: Partial) -> None:
        self.delivered = True
        if self.options.on_partial is not None:
            await self.options.on_partial(partial)


async def _pump(job: PooledJob, on_event: Callable[[UpstreamEvent], Awaitable[None]]) -> None:
    """Deliver every event of ``job`` to ``on_event``, in order, until the job ends."""
    async with contextlib.aclosing(job.events()) as events:
        async for event in events:
            await on_event(event)


class CallAttempt:
    """One attempt of a call (:meth:`Pool.call <pool.Pool.call>`). ``with attempt:``
    around the attempt's work keeps what it raises for the call to judge (the retry
    policy, the queue timeout, the deadline: :class:`Calls`); :meth:`lease` is the
    attempt's admission and connection, within the call's clocks."""

    def __init__(self, path: RequestPath, call: _Call, number: int) -> None:
        self._path = path
        self._call = call
        self.number = number  # 1-based, every attempt (refused ones too)

    def __enter__(self) -> CallAttempt:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> bool:
        if isinstance(exc, Exception):  # judged by the next step of the loop
            self._call.error = exc
            return True
        return False  # success; or a cancellation, which ends the call at once

    def lease(self, avoid: Sequence[str] = ()) -> AbstractAsyncContextManager[PooledClient]:
        """This attempt's admission and connection (:meth:`Pool.client
        <pool.Pool.client>`), bounded by the call's deadline and queue timeout, routed
        away from the Spaces earlier attempts failed on and from ``avoid``."""
        return self._path._lease_for(self._call, avoid)


class Calls:
    """A call's attempts, as an async iterator: each is run by the caller; between two,
    what the last raised decides (:meth:`RequestPath._again`): a refusal for want of
    room waits in the pool's queue again until the queue timeout; a failure the retry
    policy repeats is repeated after its backoff; anything else is raised. A success
    ends the iteration."""

    def __init__(self, path: RequestPath, call: _Call) -> None:
        self._path = path
        self._call = call
        self._number = 0

    def __aiter__(self) -> Calls:
        return self

    async def __anext__(self) -> CallAttempt:
        call = self._call
        if self._number:
            error, call.error = call.error, None
            if error is None:
                raise StopAsyncIteration
            if not await self._path._again(error, call):
                call.attempts += 1
        else:
            call.attempts = 1
        self._number += 1
        call.handle = None
        return CallAttempt(self._path, call, self._number)


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

    def calls(self, api_name: str | None, options: PredictOptions, args: tuple[Any, ...] = ()
              ) -> Calls:  # fmt: skip
        """The attempts of one call (:class:`Calls`), its clocks started now."""
        started = self.clock.now()
        timeout = options.timeout
        ticket = classed_ticket(self.settings, options.ticket, _priority_of(options))
        call = _Call(api_name, args, options, started,
                     None if timeout is None else started + timeout,
                     queue_timeout_for(self.settings, ticket, options.queue_timeout_s),
                     ticket)  # fmt: skip
        return Calls(self, call)

    async def predict(
        self, api_name: str | None, args: tuple[Any, ...], options: PredictOptions
    ) -> Prediction:
        """One predict with the pool's retry policy, failover and deadline
        (:class:`PredictOptions` says what each option does)."""
        calls = self.calls(api_name, options, args)
        call = calls._call
        async for attempt in calls:
            with attempt:
                async with attempt.lease() as handle:
                    return await self._run_admitted(handle, call, attempt.number)
        raise AssertionError("a call ends by its result or its error")  # pragma: no cover

    @contextlib.asynccontextmanager
    async def _lease_for(self, call: _Call, avoid: Sequence[str]) -> AsyncIterator[PooledClient]:
        """One attempt's admission and connection for ``call``."""
        left = self._left(call.deadline)
        if left is not None and left <= 0:
            raise DeadlineExceeded("the deadline passed before the Space could be called")
        options = call.options
        queue_s = call.queue_timeout if call.queue_by is None else max(
            0.0, call.queue_by - self.clock.now())  # fmt: skip
        queue_s = queue_s if left is None else min(queue_s, left)
        failed = [*call.failed, *(a for a in avoid if a not in call.failed)]
        async with self._lease(
            options.email, options.space, queue_s, call.ticket, failed, left, call.api_name,
            options.session,
        ) as handle:
            call.handle = handle
            yield handle

    async def _run_admitted(self, handle: PooledClient, call: _Call, number: int) -> Prediction:
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
            attempts=number,
        )

    async def _again(self, exc: Exception, call: _Call) -> bool:
        """Between two attempts: raise ``exc`` unless the call goes on — waiting in the
        queue again after a refusal for want of room (within the queue timeout, counted
        from the call's start: True, not an attempt), or repeated as the retry policy
        says (False); then back off."""
        policy = self.retry_policy
        if call.delivered:
            raise exc
        requeued = policy.should_requeue(exc)
        if requeued:
            call.refusals += 1
            if call.queue_by is None:
                call.queue_by = call.started + call.queue_timeout
            by = call.queue_by if call.deadline is None else min(call.queue_by, call.deadline)
            left = by - self.clock.now()
            if left <= _REQUEUE_LAST_S:
                raise exc
            # The backoff is cut to what is left, never a reason to stop early: a call
            # refused for want of room waits until its queue timeout (a 2 s jitter drawn
            # with 0.6 s left used to end it there).
            delay = min(policy.requeue_delay(call.refusals), left / 2)
        else:
            safe = call.options.safe_to_retry
            if not isinstance(exc, UpstreamTransportError) or not policy.should_retry(
                exc, call.attempts, safe_to_retry=safe
            ):
                raise exc
            delay = policy.delay(call.attempts)
            if call.deadline is not None and self.clock.now() + delay >= call.deadline:
                raise exc
        kind = getattr(exc, "kind", "error")
        handle = call.handle
        served = handle.space if handle is not None else None
        if served is not None and served not in call.failed:
            call.failed.append(served)
        emit(self.hooks, PoolEvent("retry", served, kind))
        if call.options.space is None and not (handle is not None and handle.failed_over):
            # the next attempt is steered away from this Space (once per failure)
            emit(self.hooks, PoolEvent("failover", served, kind))
        _log.info("retrying after %s on %s (attempt %d)", kind, served, call.attempts)
        await self.clock.sleep(delay)
        return requeued

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
