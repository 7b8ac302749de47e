"""One event of a front session on the worker running it: a pool call like any other.

The event is a :meth:`Pool.call <pool.Pool.call>` under the session (its Space, its
upstream ``session_hash``): its waiting in the pool's queue, the Space's refusals, the
retries, the queue timeout and its cancellation are the pool's (one retry policy, one
deadline rule: pool/_request.py). What is the front's is Gradio's: each attempt, once
admitted, joins the event at the Space as the client sent it (``PooledClient.relay``),
relays its raw messages to the session's mailbox, and holds its lease until the Space
completes it; spacepool's queue position is sent as ``estimation`` messages while it
waits. A Space whose own queue is full, or the front's share of the Space's connections
taken, refuses that event alone: the pool puts it back in its queue
(``RetryPolicy.should_requeue``). Whatever stops the event before it runs is its
``process_completed`` error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from pool import (
    NO_ROOM,
    BusyError,
    CallAttempt,
    InvalidRequest,
    NoHealthySpaceError,
    PooledClient,
    PooledJob,
    PoolError,
    SessionLost,
    SessionNotFound,
    UpstreamTransportError,
)
from pool.admission import WaitTicket
from pool.transport import SessionDropped

from ..edge import pass_gate
from ._event_request import EventRequest
from ._front_errors import failure, refused
from ._messages import completed_cancelled, completed_error
from ._rewrite import rewriter
from ._space_view import app_of
from ._visitors import as_visitor

if TYPE_CHECKING:
    from ._front_session import FrontSession

_log = logging.getLogger("spacepool.app")
_ANNOUNCE_S = 0.25
# Refusals that say nothing about the session (the Space is there, its state too).
_NOT_DROPPED = frozenset({"queue_full", "rate_limited", "rate_limit_wait"})


class FrontEvent:
    """One event from its join to its end (see the module docstring)."""

    def __init__(self, session: FrontSession, event: EventRequest, event_id: str) -> None:
        self.session = session
        self.event = event
        self.event_id = event_id

    async def run(self) -> None:
        """The event as a pool call: its attempts, until one ran it or the pool gives
        up (then its ``process_completed`` error)."""
        session, event, event_id = self.session, self.event, self.event_id
        starting = contextlib.ExitStack()  # closed once the event runs or ended
        starting.enter_context(session.starting_event())
        starting.callback(session.admitted, event_id)
        ticket = WaitTicket()
        try:
            with as_visitor(event.email):  # a page's visitor: also an anonymous caller
                async for attempt in session.front.pool.call(
                    event.api_name, email=event.email, space=session.scope,
                    session=session.core, queue_timeout_s=event.queue_timeout_s, ticket=ticket,
                ):  # fmt: skip
                    with attempt:
                        if attempt.number > 1 and event_id in session.cancelled:
                            # cancelled as a refused join was being made: it never runs
                            session.outbox.publish(completed_cancelled(event_id))
                            break
                        if attempt.number > 1:
                            session.queue_again(event_id)
                        await self._attempt(attempt, ticket, starting)
                        break
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if event_id not in session.completed and event_id not in session.cancelled:
                session.outbox.publish(completed_error(event_id, failure(exc)))
        finally:
            starting.close()
            session.jobs.pop(event_id, None)
            session.completed.discard(event_id)
            session.cancelled.discard(event_id)

    async def _attempt(
        self, attempt: CallAttempt, ticket: WaitTicket, starting: contextlib.ExitStack
    ) -> None:
        session, event_id = self.session, self.event_id
        announcer = asyncio.get_running_loop().create_task(self._announce(ticket))
        try:
            async with contextlib.AsyncExitStack() as stack:
                handle = await self._admit(attempt, stack)
                announcer.cancel()
                session.admitted(event_id)
                await pass_gate()  # its key revoked, or out of Space-seconds: not run
                job = await self._start(handle)
                session.jobs[event_id] = job
                starting.close()
                if event_id in session.cancelled:  # cancelled as it was being joined
                    with contextlib.suppress(Exception):
                        await job.cancel()
                await self._finished(handle, job)
        except Exception as exc:
            if refused(exc):  # waits again (and may be cancelled here meanwhile)
                session.queue_again(event_id)
            raise
        finally:
            announcer.cancel()

    async def _announce(self, ticket: WaitTicket) -> None:
        """While the event waits for admission, spacepool's queue position as the
        Space's own ``estimation`` message (gradio/queueing.py ``broadcast_estimations``:
        ``rank`` 0 is next), at each change of the ticket (its store signals it: no
        polling). An event admitted within ``_ANNOUNCE_S`` says nothing (this task is
        cancelled on admission); once admitted, the Space's own are relayed."""
        session, event_id = self.session, self.event_id
        await asyncio.sleep(_ANNOUNCE_S)
        last = None
        while True:
            # The ticket's position is 1-based (0: not known yet), Gradio's rank 0-based;
            # the queue's size as far as this event (the waiters behind are not known).
            now = (ticket.position, round(ticket.estimate_s, 1))
            if event_id not in session.queued:  # admitted or cancelled meanwhile
                return
            if now != last and now[0] >= 1:
                session.outbox.publish({"msg": "estimation", "event_id": event_id,
                                        "rank": now[0] - 1, "queue_size": now[0],
                                        "rank_eta": now[1]})  # fmt: skip
                last = now
            await ticket.changed()

    async def _admit(self, attempt: CallAttempt, stack: contextlib.AsyncExitStack) -> PooledClient:
        """The attempt's lease under the session. A pinned Space of the pool that cannot
        serve any more is dropped (the session unpinned) and the event routed again; a
        session its Space lost (restarted) or that ended meanwhile is opened afresh."""
        session = self.session
        try:
            return await self._lease(attempt, stack)
        except (SessionLost, SessionNotFound):
            await session.front.reopen(session)
            return await self._lease(attempt, stack)
        except (NoHealthySpaceError, UpstreamTransportError):
            space = session.space
            if session.scope is not None or space is None:
                raise
            await session.drop(space)
            return await self._lease(attempt, stack)

    async def _lease(self, attempt: CallAttempt, stack: contextlib.AsyncExitStack) -> PooledClient:
        """While the session is unpinned, one event at a time is admitted (the first
        admitted pins it: the others follow it there)."""
        session = self.session
        pinning = session.pinning if session.space is None else contextlib.nullcontext()
        async with pinning:
            handle = await stack.enter_async_context(attempt.lease(avoid=session.avoid))
            session.space = handle.space
        return handle

    async def _start(self, handle: PooledClient) -> PooledJob:
        """The event joined at the admitted Space, its messages relayed."""
        session, event, event_id = self.session, self.event, self.event_id
        app = await app_of(session.front.pool, handle.space)
        session.ran_on = handle.space
        endpoint = app.endpoints.get(event.fn_index)
        if endpoint is None or endpoint.api_name != event.api_name:  # not a replica's order
            try:
                endpoint = app.endpoint(event.api_name)
            except ValueError as exc:
                raise InvalidRequest(f"{handle.space} cannot run this event: {exc}") from None
        front = session.front
        if not session.jobs and front.running_on(handle.space) >= front.max_upstream:
            raise BusyError(f"{front.max_upstream} Gradio sessions run events on"
                            f" {handle.space}", queue_position=0,
                            retry_after_s=min(front.idle_s, 30.0), reason=NO_ROOM)  # fmt: skip
        rewrite = rewriter(app.src, event.front_root)

        def relay(msg: dict[str, Any]) -> None:
            if msg.get("msg") == "process_completed":
                session.completed.add(event_id)
            files: list[str] = []
            if "output" in msg:  # its files may be named back by the client, anywhere
                files = front.outputs.boundary.saw_outputs(msg["output"])
            session.outbox.publish(rewrite({**msg, "event_id": event_id}), files)

        try:
            return await handle.relay(endpoint.fn_index, event.data, relay, event.fields)
        except UpstreamTransportError as exc:
            if exc.kind not in _NOT_DROPPED:  # the session is gone there
                await session.drop(handle.space)
            raise

    async def _finished(self, handle: PooledClient, job: PooledJob) -> None:
        """Wait for the event's end (its outcome fed to the pool by the job); a dropped
        session unpinned and the client told, a completion the Space never sent made up."""
        session, event_id = self.session, self.event_id
        try:
            await job.result()
        except PoolError as error:
            if isinstance(error.__cause__, SessionDropped):
                await session.drop(handle.space)
            if event_id in session.cancelled:
                return  # the Space completes a cancelled event itself (relayed)
            if event_id not in session.completed:  # the Space will not complete it any more
                session.outbox.publish(completed_error(event_id, f"the Space failed: {error}"))
                session.completed.add(event_id)
