"""The relay of one client ``session_hash`` on one worker (:class:`FrontSession`).

A client's ``session_hash`` (under one scope: ``/gradio/{alias}/`` or ``/gradio/``) is a
core session (pool/_sessions.py) named after it (:func:`core_id`), owned by the user of
its first request. What a worker keeps of it is its relay: the events it runs (their
tasks and jobs, to cancel one: :class:`~app.gradio._front_event.FrontEvent` runs each),
and whether the client holds a data stream or heartbeat open here or has an event
starting here. What the session has beyond one request is in the coordinator: its
record, its messages and its *runner* (:mod:`._messages`), and the cancels and joins
handed to its runner (:mod:`._fleet`, :mod:`._handover`). Every relay watches the
session's record and ends when it is gone (closed by the worker whose heartbeat stream
closed, or expired).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from pool import PooledJob, PoolError, SessionNotFound
from pool.admission import CURRENT, identity

from ._event_request import EventRequest
from ._fleet import MAX_CANCELS, cancels_key, ids, joins_key
from ._front_errors import FrontBusy
from ._front_event import FrontEvent
from ._handover import forward, take_forwarded
from ._messages import RUNNER_TTL_S, Item, SessionMessages, completed_cancelled

if TYPE_CHECKING:
    from ._front_sessions import FrontSessions

_log = logging.getLogger("spacepool.app")
_REOPEN_GRACE_S = 1.0  # a record gone while an event starts: looked at again after this


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
        self.ran_on: str | None = None  # the Space its last event ran on (its heartbeat's)
        self.outbox = SessionMessages(front.values, self.core, front.shared_ttl_s,
                                      front.outputs.mark)  # fmt: skip
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
        self.pinning = asyncio.Lock()  # a first event pins the session: one at a time
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
        event is a pool call (:class:`FrontEvent`) run by the session's runner: here, or
        handed to the worker running the session's events (:mod:`._handover`)."""
        front = self.front
        if front.queued >= front.max_queued:
            raise FrontBusy(f"{front.queued} events wait for admission"
                            " (POOL_GRADIO_QUEUE_MAX_SIZE)", 1.0)  # fmt: skip
        self.touch()
        event_id = uuid.uuid4().hex
        runner = await self.outbox.expect(event_id, front.worker)
        if runner == front.worker:
            self.run_here(event, event_id)
        else:
            await forward(self, event, event_id, runner, CURRENT.get())
        return event_id

    def run_here(
        self, event: EventRequest, event_id: str, context: contextvars.Context | None = None
    ) -> None:
        """Run the event here (this worker is the session's runner); ``context``: the
        one of the join (its consumer: app/teams/_keys.py), for an event handed over."""
        front = self.front
        task = asyncio.get_running_loop().create_task(FrontEvent(self, event, event_id).run(),
                                                      context=context)  # fmt: skip
        self.events[event_id] = task
        self.queued.add(event_id)
        front.queued += 1
        task.add_done_callback(functools.partial(self._gone, event_id))

    def _gone(self, event_id: str, task: asyncio.Task[None]) -> None:
        """The event's task ended (even one cancelled before it ran): this worker is
        its runner no more."""
        if self.events.get(event_id) is task:
            del self.events[event_id]
        self.admitted(event_id)
        self.front.spawn(self.outbox.release(event_id, self.front.worker))

    def admitted(self, event_id: str) -> None:
        """The event left the queue (it runs, or it ended)."""
        if event_id in self.queued:
            self.queued.discard(event_id)
            self.front.queued -= 1

    def queue_again(self, event_id: str) -> None:
        """The Space refused the event: it waits again (and may be cancelled here)."""
        if event_id not in self.queued:
            self.queued.add(event_id)
            self.front.queued += 1

    @contextlib.contextmanager
    def starting_event(self) -> Iterator[None]:
        """An event being admitted and joined: the session is in use meanwhile."""
        self.starting += 1
        try:
            yield
        finally:
            self.starting -= 1
            self.touch()

    async def drop(self, space: str) -> None:
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
            asked = [e for e in ids(raw) if e != event_id]
            return json.dumps([*asked, event_id][-MAX_CANCELS:])

        await self.front.values().update(cancels_key(self.core), ask, self.front.shared_ttl_s)

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
            self.admitted(event_id)
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
        the events that run here; joins handed over run here (:mod:`._handover`)."""
        front, done = self.front, set[str]()
        key = cancels_key(self.core)
        async with front.pool.sessions.watch(self.core) as record, \
                front.values().watch(key) as asked, \
                front.values().watch(joins_key(self.core)) as joins:  # fmt: skip
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
                                await take_forwarded(self)
                            else:
                                for event_id in ids(await front.values().get(key)):
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


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
