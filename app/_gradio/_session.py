"""Downstream Gradio sessions, each pinned to one upstream Space and session.

A client's ``session_hash`` names a :class:`FrontSession`. Its first event is routed
like any spacepool request (``Pool.client``: routing, the user's pin, admission); the
Space that admits it becomes the session's Space, and a fresh upstream session
(:class:`pool.transport.Session`, its own ``session_hash``) is opened there: every
later event of the session runs in that upstream session, so ``gr.State`` behaves as
on the Space and never crosses sessions.

Each event holds its admission lease (global, Space, user slots) from its join until
the Space completes it. The upstream session's messages are relayed, as they arrive,
into the session's outbox, which the client's ``queue/data`` stream reads
(gradio/routes.py ``queue_data``: the stream ends with ``close_stream`` once the
session has no pending event). A Space that drops the session (killed, restarted)
fails its running events with an error message; the session is unpinned (its state
is lost, as on a restarted Space) and its next event is routed again, away from that
Space. The session ends — its events cancelled, its slots freed, the upstream
session's heartbeat closed (unload handlers run there) — when the client's heartbeat
stream closes, or after ``idle_s`` idle: no event being started, no stream or
heartbeat open, whatever is still pending. A session belongs to the user of its
first request; :class:`FrontSessions` caps how many are open (docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pool import InvalidRequest, NoHealthySpaceError, Pool, PooledClient, UpstreamTransportError
from pool.admission import WaitTicket
from pool.transport import Call, CallCancelled, Session, SessionDropped

from .._boundary import Boundary
from ._rewrite import rewriter

_log = logging.getLogger("spacepool.app")
_ANNOUNCE_S = 0.25


class FrontUnavailable(Exception):
    """The Space's connection is not on the native transport (POOL_TRANSPORT)."""


class FrontBusy(Exception):
    """Too many front sessions open (in all, of one user, or upstream on one Space):
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


def completed_error(event_id: str, message: str) -> dict[str, Any]:
    """The message that ends an event with an error, as a Space sends it."""
    return {"msg": "process_completed", "event_id": event_id, "success": False,
            "output": {"error": message}}  # fmt: skip


class FrontSession:
    """One downstream ``session_hash`` (see the module docstring)."""

    def __init__(
        self, scope: str | None, session_hash: str, user: str | None, front: FrontSessions
    ) -> None:
        self.scope = scope  # the alias of /gradio/{alias}/, None for /gradio/
        self.hash = session_hash
        self.user = user  # the keyed hash of the user of its first request (owner)
        self.front = front
        self.starting = 0  # events being admitted and joined upstream
        self.space: str | None = scope  # the pinned Space
        self.upstream: Session | None = None
        self.outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.pending: set[str] = set()  # joined events not completed yet
        self.calls: dict[str, Call] = {}
        self.completed: set[str] = set()  # events whose completion was relayed
        self.tasks: set[asyncio.Task[None]] = set()
        self.avoid: list[str] = []  # Spaces that dropped this session
        self.heartbeats = 0
        self.streams = 0
        self.touched = time.monotonic()
        self.closed = False

    @property
    def idle_since(self) -> float | None:
        """When it went idle, or None: no event being started, no stream or heartbeat
        open — whatever is still pending (a result nobody reads is dropped with it)."""
        busy = self.starting or self.heartbeats or self.streams
        return None if busy else self.touched

    async def join(self, pool: Pool, event: EventRequest) -> str:
        """Admit the event and join it upstream; its event id (the service's own: the
        Space's id is mapped to it in every message). The lease is held by a task of
        its own until the Space completes the event."""
        self.touched = time.monotonic()
        event_id = uuid.uuid4().hex
        joined: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        task = asyncio.get_running_loop().create_task(self._event(pool, event, event_id, joined))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        try:
            return await asyncio.shield(joined)
        except asyncio.CancelledError:
            if not joined.done():  # the client left before its join was answered
                task.cancel()
            raise

    async def _event(
        self, pool: Pool, event: EventRequest, event_id: str, joined: asyncio.Future[str]
    ) -> None:
        ticket = WaitTicket()
        announcer = asyncio.get_running_loop().create_task(self._announce(ticket, event_id))
        starting = contextlib.ExitStack()  # closed once the event is joined or failed
        starting.enter_context(self._starting())
        try:
            async with self._admit(pool, event, ticket) as handle:
                announcer.cancel()
                call = await self._start(handle, event, event_id)
                self.pending.add(event_id)
                self.calls[event_id] = call
                starting.close()
                joined.set_result(event_id)
                await asyncio.wait([call.result])
                self._finished(handle, call, event_id)
        except BaseException as exc:
            if not joined.done():
                joined.set_exception(exc)
                if isinstance(exc, Exception):
                    return
            raise
        finally:
            starting.close()
            announcer.cancel()

    @contextlib.contextmanager
    def _starting(self) -> Iterator[None]:
        """An event being admitted and joined: the session is not idle meanwhile; its
        idle time counts anew once the event joined or failed."""
        self.starting += 1
        try:
            yield
        finally:
            self.starting -= 1
            self.touched = time.monotonic()

    async def _announce(self, ticket: WaitTicket, event_id: str) -> None:
        """While the event waits for admission, spacepool's queue position as the
        Space's own ``estimation`` message (clients keep messages of an event id they
        do not know yet: gradio_client ``stream_messages``, @gradio/client
        ``pending_stream_messages``), at each change of the ticket. An event admitted
        within ``_ANNOUNCE_S`` says nothing (this task is cancelled on admission)."""
        await asyncio.sleep(_ANNOUNCE_S)
        last = None
        while True:
            now = (ticket.position, round(ticket.estimate_s, 1))
            if now != last:
                self.outbox.put_nowait({"msg": "estimation", "event_id": event_id,
                                        "rank": now[0], "queue_size": now[0] + 1,
                                        "rank_eta": now[1]})  # fmt: skip
                last = now
            await ticket.changed()

    @contextlib.asynccontextmanager
    async def _admit(self, pool: Pool, event: EventRequest, ticket: WaitTicket) -> Any:
        """``Pool.client`` for this session's Space; a pinned Space of the pool that
        cannot serve any more is dropped (state lost) and the event routed again."""
        space, entered = self.space, False
        try:
            async with pool.client(
                event.email, space=space, queue_timeout_s=event.queue_timeout_s,
                avoid=self.avoid, api_name=event.api_name, ticket=ticket,
            ) as handle:  # fmt: skip
                entered = True
                yield handle
                return
        except (NoHealthySpaceError, UpstreamTransportError):
            if entered or self.scope is not None or space is None:
                raise
            self._drop(space)
        async with pool.client(
            event.email, queue_timeout_s=event.queue_timeout_s, avoid=self.avoid,
            api_name=event.api_name, ticket=ticket,
        ) as handle:  # fmt: skip
            yield handle

    async def _start(self, handle: PooledClient, event: EventRequest, event_id: str) -> Call:
        await handle.screen(event.data)  # the secret guard, as on /api/predict
        session = self._upstream_on(handle)
        endpoint = session.app.endpoints.get(event.fn_index)
        if endpoint is None or endpoint.api_name != event.api_name:  # not a replica's order
            try:
                endpoint = session.app.endpoint(event.api_name)
            except ValueError as exc:
                raise InvalidRequest(f"{handle.space} cannot run this event: {exc}") from None
        rewrite = rewriter(session.app.src, event.front_root)

        def relay(msg: dict[str, Any]) -> None:
            if msg.get("msg") == "process_completed":
                self.completed.add(event_id)
            if "output" in msg:  # its files may be named back by the client
                self.front.boundary.saw_outputs(msg["output"])
            self.outbox.put_nowait(rewrite({**msg, "event_id": event_id}))

        try:
            return await session.join_data(endpoint.fn_index, event.data, relay=relay)
        except Exception as exc:
            error = handle.report(exc)
            if isinstance(error, UpstreamTransportError):  # the session is gone there
                self._drop(handle.space)
            raise error from exc

    def _upstream_on(self, handle: PooledClient) -> Session:
        """The upstream session, opened on the admitting Space (and pinned to it)."""
        if self.upstream is not None and self.space == handle.space:
            return self.upstream
        native = handle.raw
        transport, app = getattr(native, "transport", None), getattr(native, "app", None)
        if transport is None or app is None:
            raise FrontUnavailable("the Gradio front needs POOL_TRANSPORT=native")
        if self.front.upstream_on(handle.space) >= self.front.max_upstream:
            raise FrontBusy(f"{self.front.max_upstream} Gradio sessions are open on"
                            f" {handle.space}", min(self.front.idle_s, 30.0))  # fmt: skip
        self._close_upstream()
        self.space = handle.space
        self.upstream = Session(transport, app, uuid.uuid4().hex)
        return self.upstream

    def _finished(self, handle: PooledClient, call: Call, event_id: str) -> None:
        """The event ended: its outcome fed to the pool; a dropped session unpinned and
        the client told, a completion the Space never sent made up."""
        self.calls.pop(event_id, None)
        relayed = event_id in self.completed
        self.completed.discard(event_id)
        error = call.result.exception()
        if error is None:
            handle.outcome = "success"
            return
        if isinstance(error, SessionDropped):
            handle.report(error)
            self._drop(handle.space)
        if isinstance(error, CallCancelled):
            return  # the Space completes a cancelled event itself (relayed)
        if not relayed:  # the Space will not complete it any more
            self.outbox.put_nowait(
                completed_error(event_id, f"the Space failed: {error}")
            )

    def _drop(self, space: str) -> None:
        """The Space dropped the upstream session: its state is gone; route again."""
        _log.info("Gradio front: Space %s dropped a session; its next event is routed again",
                  space)  # fmt: skip
        self._close_upstream()
        if self.scope is None:
            self.space = None
            if space not in self.avoid:
                self.avoid.append(space)

    def _close_upstream(self) -> None:
        old, self.upstream = self.upstream, None
        if old is not None:
            task = asyncio.get_running_loop().create_task(old.aclose())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def delivered(self, msg: dict[str, Any]) -> bool:
        """Note a message sent to the client; True when the stream should end
        (its event completed and no other is pending)."""
        if msg.get("msg") != "process_completed":
            return False
        self.pending.discard(str(msg.get("event_id")))
        return not self.pending

    async def cancel(self, event_id: str) -> None:
        """Cancel one event upstream (the Space completes it empty)."""
        call = self.calls.get(event_id)
        if call is not None:
            with contextlib.suppress(Exception):
                await call.cancel()

    async def aclose(self) -> None:
        """End the session: cancel its events (their slots freed), close upstream."""
        self.closed = True
        # A Space keeps running an event whose stream was cut: cancel each there first.
        await asyncio.gather(*(self.cancel(event_id) for event_id in list(self.calls)))
        upstream, self.upstream = self.upstream, None
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if upstream is not None:
            with contextlib.suppress(Exception):
                await upstream.aclose()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


class FrontSessions:
    """Every live :class:`FrontSession` of this process, by (scope, hash), within
    caps: ``max_sessions`` in all, ``max_per_user`` of one user (anonymous callers
    are one user), ``max_upstream`` holding an upstream session on one Space (each
    holds up to two of the Space's connections: its data stream and heartbeat, so
    the front never takes the connections the JSON API's calls need)."""

    def __init__(
        self, idle_s: float, *, max_sessions: int, max_per_user: int, max_upstream: int,
        boundary: Boundary,
    ) -> None:  # fmt: skip
        self.idle_s = idle_s
        self.boundary = boundary  # told of every output file relayed (app._boundary)
        self.max_sessions = max_sessions
        self.max_per_user = max_per_user
        self.max_upstream = max_upstream
        self._sessions: dict[tuple[str | None, str], FrontSession] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._ending: set[asyncio.Task[None]] = set()
        # REST calls (._rest) not read yet: event id → (session, made for the call)
        self.rest: dict[str, tuple[FrontSession, bool]] = {}

    def get(self, scope: str | None, session_hash: str, user: str | None) -> FrontSession | None:
        """The session, if it exists and belongs to ``user`` (else None: to another
        user a session hash in use is unknown)."""
        session = self._sessions.get((scope, session_hash))
        if session is None or session.closed or session.user != user:
            return None
        return session

    def open(self, scope: str | None, session_hash: str, user: str | None) -> FrontSession:
        """The session, made on first use (:class:`FrontBusy` over a cap,
        :class:`NotYours` when another user's)."""
        key = (scope, session_hash)
        session = self._sessions.get(key)
        if session is not None and not session.closed:
            if session.user != user:
                raise NotYours(session_hash)
            return session
        live = [s for s in self._sessions.values() if not s.closed]
        retry = min(self.idle_s, 30.0)
        if len(live) >= self.max_sessions:
            raise FrontBusy(f"{len(live)} Gradio sessions are open"
                            " (POOL_GRADIO_MAX_SESSIONS)", retry)  # fmt: skip
        if sum(1 for s in live if s.user == user) >= self.max_per_user:
            raise FrontBusy(f"this user has {self.max_per_user} Gradio sessions open"
                            " (POOL_GRADIO_MAX_SESSIONS_PER_USER)", retry)  # fmt: skip
        session = self._sessions[key] = FrontSession(scope, session_hash, user, self)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        return session

    def upstream_on(self, space: str) -> int:
        """Sessions holding an upstream session on ``space``."""
        return sum(1 for s in self._sessions.values()
                   if s.upstream is not None and s.space == space)  # fmt: skip

    def end_later(self, session: FrontSession) -> None:
        """:meth:`end` in a task of its own (from a stream that is closing)."""
        task = asyncio.get_running_loop().create_task(self.end(session))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def end(self, session: FrontSession) -> None:
        """Close ``session`` and forget it."""
        if self._sessions.get((session.scope, session.hash)) is session:
            del self._sessions[(session.scope, session.hash)]
        for event_id in [e for e, (s, _) in self.rest.items() if s is session]:
            del self.rest[event_id]
        await session.aclose()

    async def _sweep(self) -> None:
        """End the sessions idle for ``idle_s`` (:attr:`FrontSession.idle_since`)."""
        while True:
            await asyncio.sleep(min(30.0, max(0.05, self.idle_s / 4)))
            now = time.monotonic()
            for session in list(self._sessions.values()):
                since = session.idle_since
                if since is not None and now - since > self.idle_s:
                    await self.end(session)

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.aclose() for s in sessions), return_exceptions=True)
