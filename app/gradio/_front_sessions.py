"""Front sessions: a client's ``session_hash`` served by the pool's one session mechanism.

A client's ``session_hash`` (under one scope: ``/gradio/{alias}/`` or ``/gradio/``) is a
core session (pool/_sessions.py) named after it (:func:`~._front_session.core_id`),
owned by the user of its first request and opened unpinned (``Sessions.open_named``).
Each of its events is a pool call like any other (``Pool.call`` under the session:
routing, the user's pin, admission, refusals, retries, the queue timeout: the pool's;
:mod:`._front_event`); the first admitted pins it to the Space that admitted it, so
every event runs in the same upstream ``session_hash``: ``gr.State`` behaves as on the
Space and never crosses sessions.

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
(:meth:`FrontSession.join`, :mod:`._handover`). Every relay watches the session's
record and ends when it is gone (closed by the worker whose heartbeat stream closed, or
expired).

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
import logging
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from pool import Pool, PoolError, SessionNotFound, UserLimitReached, cancelling
from pool.admission import CURRENT, Consumer, SharedValues, identity

from ..core import Draining
from ..edge import Boundary, Gate
from ._fleet import Outputs, cancels_key, joins_key
from ._front_errors import FrontBusy, NotYours
from ._front_session import FrontSession
from ._messages import completed_error

_log = logging.getLogger("spacepool.app")
_SHUTDOWN_S = 2.0  # a stopping worker tells the fleet of its events this long at most


class FrontSessions:
    """Every relay of this process, by (scope, hash), within caps: ``max_sessions`` in
    all, ``max_per_user`` open sessions of one user (the core's count, anonymous
    callers as one user), ``max_upstream`` with an event running on one Space (each
    holds a connection of the Space while it runs: the front never takes all those the
    JSON API's calls need), ``max_queued`` events waiting for admission (the bound of
    the front's queue: Gradio's ``max_size``)."""

    def __init__(
        self, idle_s: float, *, max_sessions: int, max_per_user: int, max_upstream: int,
        max_queued: int, boundary: Boundary, pool: Pool, draining: Draining | None = None,
    ) -> None:  # fmt: skip
        self.idle_s = idle_s
        # Set when the process was told to stop: its endless streams end (app/core/_draining.py).
        self.draining = draining if draining is not None else Draining()
        # The gate of a key's events handed over by another worker (app/edge/_auth.py GATE)
        self.gate_of: Callable[[str], Gate] | None = None
        self.worker = uuid.uuid4().hex[:16]  # this process, as a session's runner
        # The output files relayed to clients, known fleet-wide (the trust boundary's).
        self.outputs = Outputs(self.values, boundary)
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
        for key in (cancels_key(session.core), joins_key(session.core)):
            with contextlib.suppress(PoolError):
                await self.values().delete(key)

    def _forget(self, session: FrontSession) -> None:
        if self._sessions.get((session.scope, session.hash)) is session:
            del self._sessions[(session.scope, session.hash)]

    async def _follow(self) -> None:
        """The core's idle rule for the relays of this process: a session in use here
        (:attr:`FrontSession.busy`, or used since the last look) has its record
        renewed; one whose record's expiry passed is looked up, and ended here when the
        record is gone."""
        sessions = self.pool.sessions
        while True:
            if cancelling():  # a store error may be how its cancel came: end here
                raise asyncio.CancelledError
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


def _logged(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        _log.warning("Gradio front: %s", exc)
