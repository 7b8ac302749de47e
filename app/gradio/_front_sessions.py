"""Front sessions: a client's ``session_hash`` served by the pool's one session mechanism.

A client's ``session_hash`` (under one scope: ``/gradio/{alias}/`` or ``/gradio/``) is a
core session (pool/_sessions.py) named after it (:func:`core_id`), owned by the user of
its first request and opened unpinned (``Sessions.open_named``). Its first event is
routed and admitted like any spacepool call (``Pool.client``: routing, the user's pin,
admission) and pins it to the Space that admitted it; every event runs under it
(``Pool.client(session=...)``), so in the same upstream ``session_hash``: ``gr.State``
behaves as on the Space and never crosses sessions.

A join is answered at once with the event's id, as a Gradio server answers it; the event
then waits in the pool's admission queue (FIFO, classes, fairness: as every call) for up
to ``POOL_QUEUE_TIMEOUT_S``, its queue position sent as ``estimation`` messages; once
admitted it is joined at the Space and holds its lease and connection until the Space
completes it (events of a session running at once share the upstream session's one
data stream: pool/transport/_native.py ``Continued``). A Space that refuses it (its own
queue full) refuses that event alone: it waits in the pool's queue again. Whatever
stops an event before it runs is its ``process_completed`` error.

No sticky sessions: each request of a client may reach any worker or host of the fleet
(docs/gradio-front.md, "Several workers and hosts"). What a worker keeps is its relay
of the session (:class:`FrontSession`, made by the first request of the session that
reaches it): the events it runs (their tasks and jobs, to cancel one), and whether the
client holds a data stream or heartbeat open here or has an event starting here. What
the session has beyond one request is in the coordinator: its record (owner, pin, idle
clock: pool/_sessions.py), its messages and its *runner* (:mod:`._messages`: the one
place they are published and read), and the cancels and joins handed to its runner.
The events of a session run on one worker at a time (one upstream session has one data
stream): a join that reaches another while the runner has events is handed to it
(:meth:`FrontSession.join`). Every relay watches the session's record and ends when it
is gone (closed by the worker whose heartbeat stream closed, or expired).

One idle rule, the core's: a session ends ``POOL_GRADIO_SESSION_IDLE_S`` after its last
use (its record's TTL in the coordinator). A call renews it; so does the front while the
client holds a stream or heartbeat open or has an event starting
(:meth:`FrontSessions._follow`). When the record is gone (expired, or closed because the
client's heartbeat stream closed) the relay ends here: its running events cancelled at
the Space (their slots freed), unread results dropped.

A Space that drops the session (killed, restarted) fails its running events with an
error message; the session is unpinned (its state is lost, as on a restarted Space) and
its next event is routed again, away from that Space. Caps (docs/security.md):
``max_sessions`` relays in this process, ``max_per_user`` open sessions of one user
(the core's count, fleet-wide: anonymous callers are one user), ``max_upstream``
sessions with an event running on one Space, ``max_queued`` events waiting for
admission in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import itertools
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

from pool import (
    BusyError,
    InvalidRequest,
    NoHealthySpaceError,
    Pool,
    PooledClient,
    PooledJob,
    PoolError,
    SessionLost,
    SessionNotFound,
    UpstreamTransportError,
    UserLimitReached,
)
from pool._consumer import CURRENT, Consumer, identity
from pool.admission import SharedValues, WaitTicket
from pool.transport import ProtocolNotSupported, SessionDropped, SpaceTransport

from ..core import AuthError, Draining
from ..edge import GATE, Boundary, Gate, pass_gate
from ._messages import RUNNER_TTL_S, Item, SessionMessages, completed_cancelled, completed_error
from ._rewrite import rewriter

_log = logging.getLogger("spacepool.app")
_ANNOUNCE_S = 0.25
# Refusals that say nothing about the session (the Space is there, its state too).
_NOT_DROPPED = frozenset({"queue_full", "rate_limited", "rate_limit_wait"})
# An event the Space refused waits again after a full-jitter backoff of at most this.
_REQUEUE_BASE_S, _REQUEUE_MAX_S = 0.25, 2.0
_REOPEN_GRACE_S = 1.0  # a record gone while an event starts: looked at again after this
_SHUTDOWN_S = 2.0  # a stopping worker tells the fleet of its events this long at most
_MAX_FORWARDS = 256  # events handed to a session's runner and not taken yet, at most
_MAX_CANCELS = 64  # cancel requests of one session kept for the worker running the event
_MAX_LOOKUPS = 64  # output files of one request looked up in the fleet, at most


class FrontUnavailable(Exception):
    """The Space's connection is not on the native transport (POOL_TRANSPORT)."""


class FrontBusy(Exception):
    """Too many front sessions open (in all, of one user, or running on one Space):
    the clients' busy answer, with ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NotYours(Exception):
    """A session hash in use by another user: answered as an unknown session."""


@dataclass(frozen=True)
class EventRequest:
    """One ``queue/join`` as the client sent it, resolved against the served config."""

    api_name: str | None
    fn_index: int  # in the config the client was served
    data: list[Any]
    email: str | None
    queue_timeout_s: float
    front_root: str  # the service's address of the client's scope
    # The rest of the join body, passed to the Space as sent (``event_data``,
    # ``trigger_id``, ...: gradio/data_classes.py ``PredictBody``).
    fields: dict[str, Any] = field(default_factory=dict)
    # The join body as the client sent it: what another worker builds the event from
    # when this one is not the session's runner (:meth:`FrontSession.join`).
    body: dict[str, Any] = field(default_factory=dict)


# Builds an event from a join body on any worker: (front, scope, body, email, front_root).
EventOf = Callable[
    ["FrontSessions", str | None, dict[str, Any], str | None, str], Awaitable[EventRequest]
]


def _refused(exc: Exception) -> bool:
    """The Space refused the event before running it (its own queue full, or the
    front's share of its connections taken): the event may wait again."""
    return isinstance(exc, FrontBusy) or (
        isinstance(exc, UpstreamTransportError) and exc.kind == "queue_full"
    )


def _requeue_delay(attempt: int) -> float:
    """Full-jitter exponential backoff before refused attempt ``attempt`` waits again."""
    return random.uniform(0.0, min(_REQUEUE_MAX_S, _REQUEUE_BASE_S * 2 ** (attempt - 1)))


def _failure(exc: Exception) -> str:
    """The ``process_completed`` error of an event that could not run (nothing of the
    Space's address or of a secret: the messages the JSON API answers with)."""
    if isinstance(exc, (BusyError, FrontBusy)) or _refused(exc):
        return f"Queue is full. {exc}"
    if isinstance(exc, (PoolError, FrontUnavailable, AuthError)):
        return str(exc)
    return f"the Space failed ({type(exc).__name__})"


def core_id(scope: str | None, session_hash: str) -> str:
    """The core session of a client's ``session_hash`` under ``scope``."""
    digest = hashlib.sha256(f"{scope or ''}\0{session_hash}".encode()).hexdigest()
    return f"gradio:{digest[:40]}"


class FrontSession:
    """The relay of one client ``session_hash`` (see the module docstring)."""

    def __init__(
        self, scope: str | None, session_hash: str, user: str | None, email: str | None,
        front: FrontSessions,
    ) -> None:  # fmt: skip
        self.scope = scope  # the alias of /gradio/{alias}/, None for /gradio/
        self.hash = session_hash
        self.core = core_id(scope, session_hash)
        self.user = identity(user)  # its first request's whole (key, user): the owner
        self.consumer = CURRENT.get()  # that request's key: its background work runs as it
        self.email = email
        self.front = front
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.opened.add_done_callback(_retrieve)
        self.starting = 0  # events waiting for admission or being joined upstream
        self.space: str | None = scope  # the Space its events run on (pinned), if known
        self.transport: SpaceTransport | None = None  # that Space's, once an event ran
        self.outbox = SessionMessages(front.values, self.core, front.shared_ttl_s,
                                      front.mark_outputs)  # fmt: skip
        self.events: dict[str, asyncio.Task[None]] = {}  # from its join to its end
        self.queued: set[str] = set()  # events waiting for admission (cancelled here)
        self.jobs: dict[str, PooledJob] = {}
        self.cancelled: set[str] = set()  # events the client cancelled
        self.completed: set[str] = set()  # events whose completion was relayed
        self.avoid: list[str] = []  # Spaces that dropped this session
        self.heartbeats = 0
        self.streams = 0
        self.used = True  # used since its record was last renewed
        self.expires_at = 0.0  # wall clock: its record's expiry, as last seen
        self.closed = False
        self._pinning = asyncio.Lock()  # a first event pins the session: one at a time
        self._watcher: asyncio.Task[None] | None = None  # :meth:`_watch`

    @property
    def busy(self) -> bool:
        """In use without a call: an event being started, a stream or heartbeat open."""
        return bool(self.starting or self.heartbeats or self.streams)

    def touch(self) -> None:
        """Used now: its record is renewed at the next look (:meth:`FrontSessions._follow`)."""
        self.used = True

    async def messages(self) -> AsyncIterator[Item | None]:
        """What the session's stream reads (:meth:`SessionMessages.read`: each message
        with whether the stream ends after it), counted as an open stream (the session
        is in use) while it is read."""
        self.streams += 1
        try:
            async for item in self.outbox.read(self.front.draining):
                if item is not None:
                    self.touch()
                yield item
        finally:
            self.streams -= 1

    async def join(self, event: EventRequest) -> str:
        """Queue the event and name it at once, as a Gradio server answers a join before
        the event runs (gradio/routes.py ``queue_join``); :class:`FrontBusy` when
        ``max_queued`` events of this process wait already (Gradio's ``max_size``). The
        event waits in the pool's admission queue (the clients see spacepool's
        ``estimation`` messages meanwhile), is joined at the Space once admitted, and
        holds its lease until the Space completes it; whatever stops it before is the
        event's ``process_completed`` error, not the join's."""
        front = self.front
        if front.queued >= front.max_queued:
            raise FrontBusy(f"{front.queued} events wait for admission"
                            " (POOL_GRADIO_QUEUE_MAX_SIZE)", 1.0)  # fmt: skip
        self.touch()
        event_id = uuid.uuid4().hex
        runner = await self.outbox.expect(event_id, front.worker)
        if runner == front.worker:
            self._run(event, event_id)
        else:
            await self._forward(event, event_id, runner, CURRENT.get())
        return event_id

    def _run(self, event: EventRequest, event_id: str, context: contextvars.Context | None = None
             ) -> None:  # fmt: skip
        """Run the event here (this worker is the session's runner); ``context``: the
        one of the join (its consumer: app/_keys.py), for an event handed over."""
        front = self.front
        task = asyncio.get_running_loop().create_task(self._event(event, event_id),
                                                      context=context)  # fmt: skip
        self.events[event_id] = task
        self.queued.add(event_id)
        front.queued += 1
        task.add_done_callback(functools.partial(self._gone, event_id))

    async def _forward(
        self, event: EventRequest, event_id: str, runner: str, consumer: Consumer | None
    ) -> None:
        """Hand the event to ``runner``, the worker running the session's events now
        (one upstream session has one data stream): its join body and the consumer it
        was joined for, through the coordinator; that worker's :meth:`_watch` runs it
        as its own join. Not handed over, it ends."""
        entry = {"to": runner, "event_id": event_id, "body": event.body,
                 "front_root": event.front_root,
                 "consumer": None if consumer is None else
                 [consumer.name, consumer.key_id, consumer.priority]}  # fmt: skip

        def add(raw: str | None) -> str:
            return json.dumps([*_entries(raw), entry][-_MAX_FORWARDS:])

        front = self.front
        try:
            await front.values().update(_joins_key(self.core), add, front.shared_ttl_s)
        except PoolError as exc:
            self.outbox.publish(completed_error(event_id, _failure(exc)))

    async def _forwarded(self) -> None:
        """Run the events other workers handed to this one (:meth:`_forward`)."""
        front, mine = self.front, list[dict[str, Any]]()

        def take(raw: str | None) -> str | None:
            nonlocal mine
            entries = _entries(raw)
            mine = [e for e in entries if e.get("to") == front.worker]
            return json.dumps([e for e in entries if e not in mine]) if mine else None

        await front.values().update(_joins_key(self.core), take, front.shared_ttl_s)
        if not mine:
            return
        asked = _ids(await front.values().get(_cancels_key(self.core)))
        for entry in mine:
            event_id = str(entry.get("event_id"))
            if event_id in asked:  # cancelled before it ran
                self.outbox.publish(completed_cancelled(event_id))
                with contextlib.suppress(PoolError):
                    await self.outbox.release(event_id, front.worker)
                continue
            try:
                consumer = _consumer(entry.get("consumer"))
                if front.event_of is None:
                    raise FrontUnavailable("this worker cannot build front events")
                joined = CURRENT.set(consumer)  # its files and user are its key's
                try:
                    body = dict(entry.get("body") or {})
                    event = await front.event_of(front, self.scope, body, self.email,
                                                 str(entry.get("front_root")))  # fmt: skip
                finally:
                    CURRENT.reset(joined)
                runner = await self.outbox.claim(event_id, front.worker)
            except Exception as exc:
                self.outbox.publish(completed_error(event_id, _failure(exc)))
                with contextlib.suppress(PoolError):
                    await self.outbox.release(event_id, front.worker)
                continue
            if runner == front.worker:
                context = contextvars.copy_context()
                context.run(CURRENT.set, consumer)
                gate = None if consumer is None or front.gate_of is None else (
                    front.gate_of(consumer.key_id))  # fmt: skip
                context.run(GATE.set, gate)
                self._run(event, event_id, context)
            else:
                await self._forward(event, event_id, runner, consumer)

    def _gone(self, event_id: str, task: asyncio.Task[None]) -> None:
        """The event's task ended (even one cancelled before it ran): this worker is
        its runner no more."""
        if self.events.get(event_id) is task:
            del self.events[event_id]
        self._admitted(event_id)
        self.front.spawn(self.outbox.release(event_id, self.front.worker))

    async def _event(self, event: EventRequest, event_id: str) -> None:
        """The event from its join to its end. A Space that refuses it (its own queue
        full, or the front's share of its connections taken) puts it back in the pool's
        queue after a short backoff, until ``queue_timeout_s`` after the join."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + event.queue_timeout_s
        starting = contextlib.ExitStack()  # closed once the event runs or ended
        starting.enter_context(self._starting())
        starting.callback(self._admitted, event_id)
        try:
            for attempt in itertools.count(1):
                try:
                    await self._attempt(event, event_id, deadline - loop.time(), starting)
                    return
                except (FrontBusy, UpstreamTransportError) as exc:
                    left = deadline - loop.time()
                    if not _refused(exc) or left <= 0 or event_id in self.cancelled:
                        raise
                    self._queue_again(event_id)
                    await asyncio.sleep(min(left, _requeue_delay(attempt)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if event_id not in self.completed and event_id not in self.cancelled:
                self.outbox.publish(completed_error(event_id, _failure(exc)))
        finally:
            starting.close()
            self.jobs.pop(event_id, None)
            self.completed.discard(event_id)
            self.cancelled.discard(event_id)

    def _admitted(self, event_id: str) -> None:
        """The event left the queue (it runs, or it ended)."""
        if event_id in self.queued:
            self.queued.discard(event_id)
            self.front.queued -= 1

    def _queue_again(self, event_id: str) -> None:
        """The Space refused the event: it waits again (and may be cancelled here)."""
        if event_id not in self.queued:
            self.queued.add(event_id)
            self.front.queued += 1

    async def _attempt(
        self, event: EventRequest, event_id: str, wait_s: float, starting: contextlib.ExitStack
    ) -> None:
        ticket = WaitTicket()
        announcer = asyncio.get_running_loop().create_task(self._announce(ticket, event_id))
        try:
            async with self._admit(event, ticket, max(0.0, wait_s)) as handle:
                announcer.cancel()
                self._admitted(event_id)
                await pass_gate()  # its key revoked, or out of Space-seconds: not run
                job = await self._start(handle, event, event_id)
                self.jobs[event_id] = job
                starting.close()
                if event_id in self.cancelled:  # cancelled as it was being joined
                    with contextlib.suppress(Exception):
                        await job.cancel()
                await self._finished(handle, job, event_id)
        finally:
            announcer.cancel()

    @contextlib.contextmanager
    def _starting(self) -> Iterator[None]:
        """An event being admitted and joined: the session is in use meanwhile."""
        self.starting += 1
        try:
            yield
        finally:
            self.starting -= 1
            self.touch()

    async def _announce(self, ticket: WaitTicket, event_id: str) -> None:
        """While the event waits for admission, spacepool's queue position as the
        Space's own ``estimation`` message (gradio/queueing.py ``broadcast_estimations``:
        ``rank`` 0 is next), at each change of the ticket (its store signals it: no
        polling). An event admitted within ``_ANNOUNCE_S`` says nothing (this task is
        cancelled on admission); once admitted, the Space's own are relayed."""
        await asyncio.sleep(_ANNOUNCE_S)
        last = None
        while True:
            # The ticket's position is 1-based (0: not known yet), Gradio's rank 0-based;
            # the queue's size as far as this event (the waiters behind are not known).
            now = (ticket.position, round(ticket.estimate_s, 1))
            if event_id not in self.queued:  # admitted or cancelled meanwhile
                return
            if now != last and now[0] >= 1:
                self.outbox.publish({"msg": "estimation", "event_id": event_id,
                                     "rank": now[0] - 1, "queue_size": now[0],
                                     "rank_eta": now[1]})  # fmt: skip
                last = now
            await ticket.changed()

    @contextlib.asynccontextmanager
    async def _admit(
        self, event: EventRequest, ticket: WaitTicket, wait_s: float
    ) -> AsyncIterator[PooledClient]:
        """``Pool.client`` under the session. A pinned Space of the pool that cannot
        serve any more is dropped (the session unpinned) and the event routed again; a
        session its Space lost (restarted) or that ended meanwhile is opened afresh."""
        async with contextlib.AsyncExitStack() as stack:
            try:
                handle = await self._lease(event, ticket, wait_s, stack)
            except (SessionLost, SessionNotFound):
                await self.front.reopen(self)
                handle = await self._lease(event, ticket, wait_s, stack)
            except (NoHealthySpaceError, UpstreamTransportError):
                space = self.space
                if self.scope is not None or space is None:
                    raise
                await self._drop(space)
                handle = await self._lease(event, ticket, wait_s, stack)
            yield handle

    async def _lease(
        self, event: EventRequest, ticket: WaitTicket, wait_s: float,
        stack: contextlib.AsyncExitStack,
    ) -> PooledClient:  # fmt: skip
        """The event's lease; while the session is unpinned one event at a time (the
        first admitted pins it: the others follow it there)."""
        pinning = self._pinning if self.space is None else contextlib.nullcontext()
        async with pinning:
            handle = await stack.enter_async_context(self.front.pool.client(
                event.email, space=self.scope, session=self.core, api_name=event.api_name,
                queue_timeout_s=wait_s, avoid=self.avoid, ticket=ticket,
            ))  # fmt: skip
            self.space = handle.space
        return handle

    async def _start(self, handle: PooledClient, event: EventRequest, event_id: str) -> PooledJob:
        try:
            transport, app = handle.raw.wire()
        except ProtocolNotSupported:
            raise FrontUnavailable("the Gradio front needs POOL_TRANSPORT=native") from None
        self.transport = transport
        endpoint = app.endpoints.get(event.fn_index)
        if endpoint is None or endpoint.api_name != event.api_name:  # not a replica's order
            try:
                endpoint = app.endpoint(event.api_name)
            except ValueError as exc:
                raise InvalidRequest(f"{handle.space} cannot run this event: {exc}") from None
        front = self.front
        if not self.jobs and front.running_on(handle.space) >= front.max_upstream:
            raise FrontBusy(f"{front.max_upstream} Gradio sessions run events on"
                            f" {handle.space}", min(front.idle_s, 30.0))  # fmt: skip
        rewrite = rewriter(app.src, event.front_root)

        def relay(msg: dict[str, Any]) -> None:
            if msg.get("msg") == "process_completed":
                self.completed.add(event_id)
            files: list[str] = []
            if "output" in msg:  # its files may be named back by the client, anywhere
                files = front.boundary.saw_outputs(msg["output"])
            self.outbox.publish(rewrite({**msg, "event_id": event_id}), files)

        try:
            return await handle.relay(endpoint.fn_index, event.data, relay, event.fields)
        except UpstreamTransportError as exc:
            if exc.kind not in _NOT_DROPPED:  # the session is gone there
                await self._drop(handle.space)
            raise

    async def _finished(self, handle: PooledClient, job: PooledJob, event_id: str) -> None:
        """Wait for the event's end (its outcome fed to the pool by the job); a dropped
        session unpinned and the client told, a completion the Space never sent made up."""
        try:
            await job.result()
        except PoolError as error:
            if isinstance(error.__cause__, SessionDropped):
                await self._drop(handle.space)
            if event_id in self.cancelled:
                return  # the Space completes a cancelled event itself (relayed)
            if event_id not in self.completed:  # the Space will not complete it any more
                self.outbox.publish(completed_error(event_id, f"the Space failed: {error}"))
                self.completed.add(event_id)

    async def _drop(self, space: str) -> None:
        """The Space dropped the upstream session: its state is gone; route again."""
        _log.info("Gradio front: Space %s dropped a session; its next event is routed again",
                  space)  # fmt: skip
        with contextlib.suppress(PoolError):
            await self.front.pool.sessions.unpin(self.core, self.email)
        if self.scope is None:
            self.space = None
            if space not in self.avoid:
                self.avoid.append(space)

    async def cancel(self, event_id: str) -> None:
        """Cancel one event, wherever it runs: here, or asked of the worker running it
        through the coordinator (:meth:`_watch` there does it)."""
        if event_id in self.jobs or event_id in self.events:
            await self._cancel_here(event_id)
            return
        if not event_id:
            return

        def ask(raw: str | None) -> str:
            asked = [e for e in _ids(raw) if e != event_id]
            return json.dumps([*asked, event_id][-_MAX_CANCELS:])

        await self.front.values().update(_cancels_key(self.core), ask, self.front.shared_ttl_s)

    async def _cancel_here(self, event_id: str) -> None:
        """Cancel an event of this process: upstream if it runs (the Space completes it
        empty), here if it still waits for admission (completed empty, as the Space would)."""
        job = self.jobs.get(event_id)
        if job is not None:
            self.cancelled.add(event_id)
            with contextlib.suppress(Exception):
                await job.cancel()
            return
        task = self.events.get(event_id)
        if task is None:
            return
        if event_id in self.queued:  # not admitted: nothing of it reached the Space
            self._admitted(event_id)
            task.cancel()
            self.outbox.publish(completed_cancelled(event_id))
        else:
            self.cancelled.add(event_id)  # being joined: cancelled once the Space names it

    def watch(self) -> None:
        """Start following the session's record and cancel requests (:meth:`_watch`)."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """While the relay lives: the session's record, watched (any worker's write wakes
        it: no polling), ends the relay here once it is gone (closed on another worker,
        or expired); the session's cancel requests (any worker's :meth:`cancel`) cancel
        the events that run here."""
        front, done = self.front, set[str]()
        key = _cancels_key(self.core)
        async with front.pool.sessions.watch(self.core) as record, \
                front.values().watch(key) as asked, \
                front.values().watch(_joins_key(self.core)) as joins:  # fmt: skip
            signals = {"record": record, "asked": asked, "joins": joins}
            waits = {asyncio.ensure_future(c.wait()): what for what, c in signals.items()}
            renewed = asyncio.get_running_loop().time()
            try:
                while not self.closed:
                    woke, _ = await asyncio.wait(waits, timeout=RUNNER_TTL_S / 6,
                                                 return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                    now = asyncio.get_running_loop().time()
                    if self.events and now - renewed >= RUNNER_TTL_S / 3:
                        renewed = now  # this worker runs the session's events still
                        with contextlib.suppress(PoolError):
                            await self.outbox.keep_running(front.worker)
                    for future in woke:
                        what = waits.pop(future)
                        waits[asyncio.ensure_future(signals[what].wait())] = what
                        try:
                            if what == "record":
                                await self._still_open()
                            elif what == "joins":
                                await self._forwarded()
                            else:
                                for event_id in _ids(await front.values().get(key)):
                                    if event_id not in done and event_id in self.events:
                                        done.add(event_id)
                                        await self._cancel_here(event_id)
                        except SessionNotFound:
                            front.end_later(self, expired=True)
                            return
                        except PoolError:  # the store out of reach: at the next wake-up
                            pass
            finally:
                for future in waits:
                    future.cancel()

    async def _still_open(self) -> None:
        """SessionNotFound when the record is gone: looked at again after a moment while
        an event is being admitted here (a Space restarted: it is opened afresh)."""
        sessions = self.front.pool.sessions
        try:
            await sessions.get(self.core, self.email)
        except SessionNotFound:
            if not self.starting:
                raise
            await asyncio.sleep(_REOPEN_GRACE_S)
            await sessions.get(self.core, self.email)

    async def aclose(self) -> None:
        """End the relay: cancel its events (their slots freed), drop what is unread."""
        self.closed = True
        watcher = self._watcher
        if watcher is not None and watcher is not asyncio.current_task():
            watcher.cancel()
        # A Space keeps running an event whose stream was cut: cancel each there first.
        await asyncio.gather(*(self._cancel_here(event_id) for event_id in list(self.jobs)))
        tasks = list(self.events.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


class FrontSessions:
    """Every relay of this process, by (scope, hash), within caps: ``max_sessions`` in
    all, ``max_per_user`` open sessions of one user (the core's count, anonymous
    callers as one user), ``max_upstream`` with an event running on one Space (each
    holds a connection of the Space while it runs: the front never takes all those the
    JSON API's calls need), ``max_queued`` events waiting for admission (the bound of
    the front's queue: Gradio's ``max_size``)."""

    def __init__(
        self, idle_s: float, *, max_sessions: int, max_per_user: int, max_upstream: int,
        max_queued: int, boundary: Boundary, pool: Pool, event_of: EventOf | None = None,
        draining: Draining | None = None,
    ) -> None:  # fmt: skip
        self.idle_s = idle_s
        # Set when the process was told to stop: its endless streams end (app/_draining.py).
        self.draining = draining if draining is not None else Draining()
        self.event_of = event_of  # builds an event handed over by another worker
        # The gate of a key's events handed over by another worker (app/_auth.py GATE)
        self.gate_of: Callable[[str], Gate] | None = None
        self.worker = uuid.uuid4().hex[:16]  # this process, as a session's runner
        self.boundary = boundary  # told of every output file relayed (app._boundary)
        self.pool = pool
        self.max_sessions = max_sessions
        self.max_per_user = max_per_user
        self.max_upstream = max_upstream
        self.max_queued = max_queued
        self.queued = 0  # events of every session here waiting for admission
        self._sessions: dict[tuple[str | None, str], FrontSession] = {}
        self._follower: asyncio.Task[None] | None = None
        self._ending: set[asyncio.Task[None]] = set()
        # A shared value outlives the session's idle time a little (renewed with it).
        self.shared_ttl_s = idle_s + max(60.0, idle_s)

    def values(self) -> SharedValues:
        """The coordinator's shared values (the fleet's: sessions' messages, cancels)."""
        return self.pool.coordinator.values

    async def find(
        self, scope: str | None, session_hash: str, email: str | None
    ) -> FrontSession | None:
        """The session, if it is open in the fleet and belongs to ``email``'s user
        (else None: to another user a session hash in use is unknown): its relay here,
        made for a session opened on another worker."""
        session = self._sessions.get((scope, session_hash))
        if session is None or session.closed:
            try:
                return await self.open(scope, session_hash, email, create=False)
            except (NotYours, FrontBusy):
                return None
        if session.user != identity(self.pool.hash_user(email)):
            return None
        with contextlib.suppress(Exception):
            await asyncio.shield(session.opened)
            return None if session.closed else session
        return None

    async def open(
        self, scope: str | None, session_hash: str, email: str | None, *, create: bool = True
    ) -> FrontSession:
        """The session, opened on first use (:class:`FrontBusy` over a cap,
        :class:`NotYours` when another user's; ``create=False``: :class:`NotYours` too
        when the fleet does not have it)."""
        pool = self.pool
        user = pool.hash_user(email)
        owner = identity(user)
        key = (scope, session_hash)
        session = self._sessions.get(key)
        if session is not None and not session.closed:
            if session.user != owner:
                raise NotYours(session_hash)
            await asyncio.shield(session.opened)
            return session
        live = [s for s in self._sessions.values() if not s.closed]
        if len(live) >= self.max_sessions:
            victim = self._over_share(live, CURRENT.get())
            if victim is None:
                raise FrontBusy(f"{len(live)} Gradio sessions are open"
                                " (POOL_GRADIO_MAX_SESSIONS)", min(self.idle_s, 30.0))  # fmt: skip
            if isinstance(victim, FrontSession):
                self._forget(victim)
                self.spawn(self._end_as_owner(victim))
        session = self._sessions[key] = FrontSession(scope, session_hash, user, email, self)
        if self._follower is None or self._follower.done():
            self._follower = asyncio.get_running_loop().create_task(self._follow())
        try:
            await self._open_core(session, create=create)
        except BaseException as exc:
            if self._sessions.get(key) is session:
                del self._sessions[key]
            session.closed = True
            session.opened.set_exception(exc)
            raise
        session.opened.set_result(None)
        session.watch()
        return session

    def _over_share(
        self, live: list[FrontSession], consumer: Consumer | None
    ) -> FrontSession | bool | None:
        """At the cap, for a new session of ``consumer``'s key: None to refuse it (its
        key holds its equal share — the cap ÷ the keys holding sessions, its own
        counted — or more); else the session to end for it, of the key holding the
        most (over its share), not one running an event, least recently renewed first;
        True when every such session runs an event (then the cap is passed for it).
        A key's anonymous callers count as that key; callers without one as one key."""
        mine = None if consumer is None else consumer.key_id
        held: dict[str | None, list[FrontSession]] = {}
        for session in live:
            owner = None if session.consumer is None else session.consumer.key_id
            held.setdefault(owner, []).append(session)
        share = self.max_sessions / len(set(held) | {mine})
        if len(held.get(mine, [])) >= share:
            return None
        heaviest = max((k for k in held if k != mine), key=lambda k: len(held[k]))
        idle = [s for s in held[heaviest] if not s.jobs and not s.starting]
        if not idle:
            return True
        return min(idle, key=lambda s: (s.busy, s.expires_at))

    async def _end_as_owner(self, session: FrontSession) -> None:
        """:meth:`end` run as the session's owner (its key hashes its email)."""
        CURRENT.set(session.consumer)  # this task's own context
        await self.end(session)

    async def reopen(self, session: FrontSession) -> None:
        """The session's record is gone (its Space restarted, or it expired as an
        event came): opened afresh, unpinned, for that event."""
        session.space = session.scope
        await self._open_core(session)

    async def _open_core(self, session: FrontSession, *, create: bool = True) -> None:
        sessions = self.pool.sessions
        try:
            if create:
                view = await sessions.open_named(
                    session.core, session.email, limit=self.max_per_user, idle_s=self.idle_s
                )
            else:
                view = await sessions.get(session.core, session.email)
        except UserLimitReached as exc:
            raise FrontBusy(f"this user has {self.max_per_user} Gradio sessions open"
                            " (POOL_GRADIO_MAX_SESSIONS_PER_USER)",
                            exc.retry_after_s or min(self.idle_s, 30.0)) from None  # fmt: skip
        except SessionNotFound:
            raise NotYours(session.hash) from None
        session.expires_at = view.expires_at
        if view.space:
            session.space = view.space

    def running_on(self, space: str) -> int:
        """Sessions with an event running on ``space``."""
        return sum(1 for s in self._sessions.values() if s.jobs and s.space == space)

    def end_later(self, session: FrontSession, *, expired: bool = False) -> None:
        """:meth:`end` in a task of its own (from a stream that is closing)."""
        self.spawn(self.end(session, expired=expired))

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """``work`` in a task of its own, kept until it ends (its failure logged)."""
        task = asyncio.get_running_loop().create_task(work)
        self._ending.add(task)
        task.add_done_callback(_logged)
        task.add_done_callback(self._ending.discard)

    async def end(self, session: FrontSession, *, expired: bool = False) -> None:
        """End ``session``: its core session closed (the one place sessions end; or,
        ``expired``, found gone there: closed by another worker, or expired), its relay
        here, its messages. The relays of other workers see the record gone and end
        theirs (:meth:`FrontSession._watch`)."""
        self._forget(session)
        await session.aclose()
        with contextlib.suppress(Exception):
            if expired:
                await self.pool.sessions.forget(session.core, session.email)
            else:
                await self.pool.sessions.close(session.core, session.email)
        await session.outbox.discard()
        for key in (_cancels_key(session.core), _joins_key(session.core)):
            with contextlib.suppress(PoolError):
                await self.values().delete(key)

    async def mark_outputs(self, paths: list[str]) -> None:
        """Output files relayed to a client, made known to every worker of the fleet
        (the trust boundary lets a client name back only those: :meth:`known_outputs`)."""
        ttl_s = self.boundary.outputs_ttl_s
        for path in dict.fromkeys(paths):
            await self.values().put(_output_key(path), "1", ttl_s)

    async def known_outputs(self, value: Any) -> None:
        """The output files named in a client's ``value`` that another worker relayed,
        noted here before the trust boundary checks it (app._boundary)."""
        unknown = self.boundary.unknown_outputs(value)
        for path in dict.fromkeys(unknown[:_MAX_LOOKUPS]):
            if await self.values().get(_output_key(path)) is not None:
                self.boundary.note_outputs([path])

    def _forget(self, session: FrontSession) -> None:
        if self._sessions.get((session.scope, session.hash)) is session:
            del self._sessions[(session.scope, session.hash)]

    async def remember_call(self, event_id: str, session: FrontSession, own: bool) -> None:
        """A REST call (:mod:`._rest`) to be read by ``GET call/…/{event_id}`` on any
        worker: its session, and whether it was made for the call (ended after it)."""
        record = json.dumps({"scope": session.scope, "hash": session.hash, "own": own})
        await self.values().put(_call_key(event_id), record, self.shared_ttl_s)

    async def recall(
        self, event_id: str, email: str | None, scope: str | None
    ) -> tuple[FrontSession, bool] | None:
        """The session of a REST call not read yet, and whether it was made for the
        call; taken (a call's stream is read once). None: unknown, made under another
        scope than ``scope``, or another identity's."""
        key = _call_key(event_id)
        raw = await self.values().get(key)
        try:
            found: dict[str, Any] = json.loads(raw or "null")
            made, session_hash, own = found["scope"], str(found["hash"]), bool(found["own"])
        except (ValueError, KeyError, TypeError):
            return None
        if (None if made is None else str(made)) != scope:
            return None
        session = await self.find(scope, session_hash, email)
        if session is None:
            return None
        await self.values().delete(key)
        return session, own

    async def _follow(self) -> None:
        """The core's idle rule for the relays of this process: a session in use here
        (:attr:`FrontSession.busy`, or used since the last look) has its record
        renewed; one whose record's expiry passed is looked up, and ended here when the
        record is gone."""
        sessions = self.pool.sessions
        while True:
            await asyncio.sleep(min(30.0, max(0.05, self.idle_s / 4)))
            now = self.pool.clock.wall()
            for session in list(self._sessions.values()):
                if session.closed or not session.opened.done():
                    continue
                CURRENT.set(session.consumer)  # its owner's key hashes its email (this task's)
                try:
                    if session.busy or session.used:
                        session.used = False
                        view = await sessions.renew(session.core, session.email)
                        await session.outbox.renew()
                    elif now >= session.expires_at:
                        view = await sessions.get(session.core, session.email)
                    else:
                        continue
                    session.expires_at = view.expires_at
                except SessionNotFound:
                    await self.end(session, expired=True)
                except Exception:  # the store out of reach: look again next time
                    _log.warning("Gradio front: a session could not be renewed", exc_info=True)

    async def aclose(self) -> None:
        """End every relay here (their events cancelled); the sessions themselves
        expire by their rule (another process may serve them)."""
        if self._follower is not None:
            self._follower.cancel()
        sessions, self._sessions = list(self._sessions.values()), {}
        # Their clients may read on another worker: told now, not when the claim lapses
        # (and nothing after: the Space's completion of the cancelled event is not sent).
        for session in sessions:
            for event_id in list(session.events):
                session.outbox.publish(completed_error(event_id, "the worker running it stopped"))
            session.outbox.seal()
        await asyncio.gather(*(s.aclose() for s in sessions), return_exceptions=True)
        await asyncio.gather(*(s.outbox.flush(_SHUTDOWN_S) for s in sessions))
        if self._ending:
            await asyncio.wait(list(self._ending), timeout=_SHUTDOWN_S)


def _output_key(path: str) -> str:
    return f"gfront:o:{hashlib.sha256(path.encode()).hexdigest()[:40]}"


def _call_key(event_id: str) -> str:
    return f"gfront:r:{hashlib.sha256(event_id.encode()).hexdigest()[:40]}"


def _joins_key(core: str) -> str:
    """The shared value of the events handed to the session's runner
    (:meth:`FrontSession._forward`)."""
    return f"gfront:j:{core}"


def _consumer(raw: Any) -> Consumer | None:
    """The consumer a handed-over event was joined for (ValueError: not one)."""
    if raw is None:
        return None
    name, key_id, priority = raw
    return Consumer(str(name), str(key_id), None if priority is None else str(priority))


def _entries(raw: str | None) -> list[dict[str, Any]]:
    try:
        found = json.loads(raw) if raw else []
    except ValueError:
        return []
    return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def _cancels_key(core: str) -> str:
    """The shared value of the session's cancel requests (event ids, the latest last)."""
    return f"gfront:x:{core}"


def _ids(raw: str | None) -> list[str]:
    try:
        found = json.loads(raw) if raw else []
    except ValueError:
        return []
    return [str(e) for e in found] if isinstance(found, list) else []


def _logged(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        _log.warning("Gradio front: %s", exc)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
