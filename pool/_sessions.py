"""Sessions: one Space and one upstream Gradio session, kept across calls.

A session pins one Space and one ``session_hash`` there, so that the app's
``gr.State`` (a ``gr.ChatInterface``'s history, for instance) lives across the
session's calls exactly as in a browser tab of that Space. Between calls it holds
nothing: no admission slot, no connection, no heartbeat. Each call is admitted like
any other, checks out any connection of the Space and continues the session there
(:meth:`pool.transport.SpaceClient.use_session`, whichever transport it is); when the
call ends the connection goes back and the session is retired from it, as after every
lease: its data stream and its heartbeat end (calls of one session running at once share
them: pool/transport/_native.py ``Continued``). Gradio keeps a session's state while its
heartbeat is open and for an hour after it ends (gradio/routes.py ``heartbeat``,
gradio/state_holder.py ``STATE_TTL_WHEN_CLOSED``), so the heartbeat runs only while a call needs it.

The record lives in the coordinator's shared values (``session:<sha256 of the id>``),
so every worker and host of the fleet serves the session's calls. Its TTL is
``POOL_SESSION_IDLE_S``, renewed by every call: a session expires after that long
without one. The id is a random token (the only credential of an anonymous session);
the record keeps the identity that opened it (pool/_consumer.py :func:`identity`: the
keyed hash of the email within its API key, else that key's anonymous user), and a call
under another identity — another key's anonymous caller included — is answered as for
an unknown id (:class:`SessionNotFound`).

A Space that restarted has lost every session: each call first asks the Space for its
``app_id`` (``gradio_api/app_id``, a few bytes); one that differs from the session's
is :class:`SessionLost` and the session is deleted — never a fresh state in silence.

How many sessions one user holds open is counted fleet-wide (pool/_holdings.py,
``sessions-held:<identity>``, every anonymous caller of one key together as one user):
``open`` with a ``limit`` refuses a user at it with :class:`~pool.UserLimitReached`
(``too_many_sessions``, ``retry_after_s`` until the first of theirs expires unused).
A session leaves the count when it is closed or lost, or, having expired, when the user
is next at the limit; a session in use re-writes the count at least once per
``POOL_SESSION_IDLE_S`` (``indexed``), so the count never expires before it does.

A session opened without a Space is *unpinned* (:meth:`Sessions.open`, and
:meth:`Sessions.open_named`: the Gradio front's, named after the client's own
``session_hash``): it has no Space until its first call, which is routed by its
``api_name`` and admitted like any other (the user's pin in that app, when there is
one), and is pinned to the Space that admitted it (:meth:`Sessions.attach`); one opened
for an app (``app``) is routed among that app's replicas only. A Space that dropped a
front session unpins it (:meth:`Sessions.unpin`: a fresh upstream ``session_hash``, its
state lost as on a restarted Space) and its next call is routed again. A front session
keeps its own idle time (``idle_s`` in the record: ``POOL_GRADIO_SESSION_IDLE_S``) and
its own count of what each user holds (``family``); expiry, renewal
(:meth:`Sessions.renew`) and ending (:meth:`Sessions.close`) are the same for every
session.

A replicated Space keeps a session on one replica through cookies
(pool/transport/_affinity.py): the session's first request (that ``app_id`` question,
when it is opened) reaches some replica, whose cookies the record keeps (``replica``),
so every later call of the session, on any connection or worker, reaches it again, and
the ``app_id`` compared is that replica's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import secrets
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from ._clock import Clock
from ._consumer import identity
from ._exceptions import InvalidRequest, SessionLost, SessionNotFound, UnknownSpace
from ._holdings import Holdings
from .admission import Changed, SharedValues
from .connections import Connection, SpacePool
from .transport import Replica, SpaceClient

_PREFIX = "session:"
_HELD = "sessions-held:"  # sessions-held:<user> → the keys of their open sessions
FRONT = "gradio"  # the Gradio front's family: counted apart (gradio-sessions-held:<user>)
_OPENING_S = 120.0  # a session is being opened this long at most (connect, app_id)


@dataclass(frozen=True)
class PoolSession:
    """An open session: pass it (or its ``id``) as ``session=`` to ``predict``/``client``."""

    id: str
    space: str  # "" while unpinned (Sessions.open_named): its first call pins it
    expires_at: float  # wall clock (seconds since the epoch): no call until then, it ends

    def __str__(self) -> str:
        return self.id


@dataclass(frozen=True)
class SessionRecord:
    """What the fleet knows of one session (no secret: the id is only hashed in)."""

    key: str
    space: str | None  # None: unpinned, the next call pins it
    upstream: str  # the session_hash on the Space
    owner: str | None  # the identity that opened it (pool/_consumer.py identity)
    app_id: Any
    used: float  # wall clock of the last call (or the opening)
    replica: Replica = ()  # the replica's cookies (pool/transport/_affinity.py)
    indexed: float = 0.0  # wall clock when the owner's count was last re-written for it
    idle_s: float = 0.0  # it ends after this long unused (0: POOL_SESSION_IDLE_S)
    family: str = ""  # whose count of open sessions it is in ("": conversations)
    app: str | None = None  # the app an unpinned session is bound to (None: any)

    def dumps(self) -> str:
        return json.dumps({"space": self.space, "upstream": self.upstream,
                           "owner": self.owner, "app_id": self.app_id,
                           "used": self.used, "replica": self.replica,
                           "indexed": self.indexed, "idle_s": self.idle_s,
                           "family": self.family, "app": self.app})  # fmt: skip

    @classmethod
    def loads(cls, key: str, raw: str) -> SessionRecord:
        """ValueError, KeyError or TypeError for a value that is not a record."""
        data = json.loads(raw)
        space = data["space"]
        return cls(key, None if space is None else str(space), str(data["upstream"]),
                   data["owner"], data["app_id"], float(data["used"]),
                   _cookies(data.get("replica", ())), float(data.get("indexed", 0.0)),
                   float(data.get("idle_s", 0.0)), str(data.get("family", "")),
                   None if data.get("app") is None else str(data["app"]))  # fmt: skip

    def renewed(self, used: float) -> SessionRecord:
        return dataclasses.replace(self, used=used)


def _cookies(raw: Any) -> tuple[tuple[str, str, str, str], ...]:
    """A record's ``replica`` back from JSON (lists of four strings)."""
    return tuple((str(n), str(v), str(d), str(p)) for n, v, d, p in raw)


def _key(session_id: str) -> str:
    return _PREFIX + hashlib.sha256(session_id.encode()).hexdigest()[:32]


class Sessions:
    """Opens, finds, renews and ends sessions; attaches one to a leased connection."""

    def __init__(
        self, *, values: Callable[[], SharedValues], spaces: Mapping[str, SpacePool],
        clock: Clock, idle_s: float, hash_user: Callable[[str | None], str | None],
    ) -> None:  # fmt: skip
        """``values``: the coordinator's shared values (once started)."""
        self._values = values
        self._spaces = spaces
        self._clock = clock
        self.idle_s = idle_s
        self._hash_user = hash_user
        # The sessions each user holds open, fleet-wide (see the module docstring); the
        # Gradio front's apart, under their own limit.
        self.held = Holdings(
            values, _HELD, what="sessions", ttl_s=4 * idle_s, grace_s=_OPENING_S,
            clock=clock.wall,
        )  # fmt: skip
        self._held = {"": self.held, FRONT: Holdings(
            values, f"{FRONT}-{_HELD}", what="sessions", ttl_s=4 * idle_s,
            grace_s=_OPENING_S, clock=clock.wall,
        )}  # fmt: skip

    def _idle(self, record: SessionRecord) -> float:
        return record.idle_s or self.idle_s

    async def open(
        self, email: str | None, space: str | None = None, *, limit: int | None = None,
        app: str | None = None,
    ) -> PoolSession:  # fmt: skip
        """A new session for ``email`` (None: anonymous). On ``space``, when named: the
        Space is connected to (no admission slot) to learn its ``app_id``. Otherwise it
        is opened unpinned (its ``space`` is ``""``) and its first call, routed by its
        ``api_name`` like any call (the user's pin in that app when there is one), pins
        it (issue 37); ``app`` binds it to one app's replicas. ``limit``: the sessions
        one user may hold open (every anonymous caller together counting as one); at it,
        :class:`~pool.UserLimitReached` before anything is connected."""
        user = self._hash_user(email)
        session_id = secrets.token_urlsafe(24)
        key = _key(session_id)
        await self.held.take(user, key, limit, self._lasts)
        try:
            if space is None:
                now = self._clock.wall()
                record = SessionRecord(key, None, uuid.uuid4().hex, identity(user), None, now,
                                       indexed=now, app=app)  # fmt: skip
                await self._values().put(key, record.dumps(), self.idle_s)
                return self.view(session_id, record)
            return await self._open(user, space, session_id)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.held.drop(user, key)
            raise

    async def open_named(
        self, session_id: str, email: str | None, *, limit: int | None, idle_s: float,
        family: str = FRONT,
    ) -> PoolSession:  # fmt: skip
        """The session ``session_id`` (a name the caller chose: the Gradio front's),
        opened unpinned when it does not exist (nothing connected: its first call pins
        it); :class:`SessionNotFound` when it is another user's. ``limit``, as
        :meth:`open`'s, counts ``family``'s sessions."""
        user = self._hash_user(email)
        key = _key(session_id)
        found = await self._values().get(key)
        if found is not None:
            return self.view(session_id, await self._load(session_id, email))
        await self._held[family].take(user, key, limit, self._lasts)
        now = self._clock.wall()
        record = SessionRecord(key, None, uuid.uuid4().hex, identity(user), None, now, (),
                               now, idle_s, family)  # fmt: skip
        made = record.dumps()
        try:
            stored = await self._values().update(
                key, lambda raw: made if raw is None else None, idle_s
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await self._held[family].drop(user, key)
            raise
        if stored != made:  # opened meanwhile by another request: that one, if ours
            await self._held[family].drop(user, key)
            return self.view(session_id, await self._load(session_id, email))
        return self.view(session_id, record)

    async def _lasts(self, key: str) -> float | None:
        """How long the session under ``key`` lasts at most unused; None: it ended."""
        raw = await self._values().get(key)
        if raw is None:
            return None
        try:
            record = SessionRecord.loads(key, raw)
        except (ValueError, KeyError, TypeError):
            return math.inf
        return record.used + self._idle(record) - self._clock.wall()

    async def _open(self, user: str | None, space: str, session_id: str) -> PoolSession:
        if space not in self._spaces:
            raise UnknownSpace(space, list(self._spaces))
        sp = self._spaces[space]
        async with self._clock.timeout(None):  # real I/O, bounded by the connect timeout
            conn = await sp.checkout()
        try:  # the replica this first request reaches is the session's
            app_id, replica = await self._current_app_id(sp, conn.client, (), first=True)
        finally:
            sp.checkin(conn, discard=False)
        now = self._clock.wall()
        record = SessionRecord(_key(session_id), space, uuid.uuid4().hex, identity(user),
                               app_id, now, replica, indexed=now)  # fmt: skip
        await self._values().put(record.key, record.dumps(), self.idle_s)
        return PoolSession(session_id, space, now + self.idle_s)

    async def _load(self, session: str | PoolSession, email: str | None) -> SessionRecord:
        session_id = session.id if isinstance(session, PoolSession) else str(session)
        key = _key(session_id)
        raw = await self._values().get(key)
        missing = SessionNotFound(f"no session {session_id[:8]}… here (unknown or expired)")
        if raw is None:
            raise missing
        try:
            record = SessionRecord.loads(key, raw)
        except (ValueError, KeyError, TypeError):
            raise missing from None
        if record.owner != identity(self._hash_user(email)):  # the whole (key, user)
            raise missing
        if record.space is not None and record.space not in self._spaces:
            raise missing
        return record

    def view(self, session: str | PoolSession, record: SessionRecord) -> PoolSession:
        session_id = session.id if isinstance(session, PoolSession) else str(session)
        return PoolSession(session_id, record.space or "", record.used + self._idle(record))

    async def get(self, session: str | PoolSession, email: str | None) -> PoolSession:
        """The live session (SessionNotFound if unknown, expired or not the caller's)."""
        return self.view(session, await self._load(session, email))

    def watch(self, session: str | PoolSession) -> AbstractAsyncContextManager[Changed]:
        """Wake-ups for each write of the session's record (renewed, pinned, ended) by
        any process of the fleet: a holder that watches learns at once that it ended."""
        session_id = session.id if isinstance(session, PoolSession) else str(session)
        return self._values().watch(_key(session_id))

    async def close(self, session: str | PoolSession, email: str | None) -> None:
        """End the session (SessionNotFound as :meth:`get`). Nothing of it runs upstream
        between calls; the Space drops its state by its own rule (an hour)."""
        record = await self._load(session, email)
        await self._values().delete(record.key)
        await self._held[record.family].drop(record.owner, record.key)

    async def forget(self, session_id: str, email: str | None, family: str = FRONT) -> None:
        """A session its holder found ended (expired unused): out of its user's count
        now, not when they next reach their limit (a no-op when it was counted out)."""
        await self._held[family].drop(self._hash_user(email), _key(session_id))

    async def resolve(
        self, session: str | PoolSession, email: str | None, space: str | None
    ) -> SessionRecord:
        """The session of a call, renewed for another ``POOL_SESSION_IDLE_S``."""
        record = await self._load(session, email)
        if space is not None and record.space is not None and space != record.space:
            raise InvalidRequest(
                f"the session is on Space {record.space!r}, not {space!r}: leave space out"
            )
        now = self._clock.wall()
        renewed = record.renewed(now)
        held = self._held[record.family]
        if now - record.indexed >= min(self._idle(record), held.ttl_s / 4):
            await held.keep(record.owner, record.key)  # the count outlives the session
            renewed = dataclasses.replace(renewed, indexed=now)
        await self._values().put(renewed.key, renewed.dumps(), self._idle(record))
        return renewed

    async def renew(self, session: str | PoolSession, email: str | None) -> PoolSession:
        """The session in use without a call (the Gradio front's client holds its
        streams open): another ``idle_s`` from now (SessionNotFound as :meth:`get`)."""
        return self.view(session, await self.resolve(session, email, None))

    async def unpin(self, session: str | PoolSession, email: str | None) -> None:
        """The session's Space dropped it (killed, restarted): its state is gone there;
        a fresh upstream session, pinned by the next call (which may go elsewhere)."""
        record = await self._load(session, email)
        fresh = uuid.uuid4().hex

        def unpinned(raw: str | None) -> str | None:
            if raw is None:
                return None
            now = SessionRecord.loads(record.key, raw)
            if now.upstream != record.upstream:
                return None  # unpinned (or moved) meanwhile
            return dataclasses.replace(now, space=None, upstream=fresh, app_id=None,
                                       replica=()).dumps()  # fmt: skip

        await self._values().update(record.key, unpinned, self._idle(record))

    async def attach(self, sp: SpacePool, conn: Connection, record: SessionRecord) -> None:
        """Continue ``record``'s upstream session on the leased ``conn`` (an unpinned
        one is pinned to ``sp`` first); SessionLost (and the session deleted) if the
        Space restarted since it was opened."""
        if record.space is None:
            record = await self._pin(sp, conn.client, record)
        current, _ = await self._current_app_id(sp, conn.client, record.replica)
        if current != record.app_id:
            with contextlib.suppress(Exception):
                await self._values().delete(record.key)
                await self._held[record.family].drop(record.owner, record.key)
            raise SessionLost(
                f"Space {sp.name!r} restarted since the session was opened: its state is"
                " gone; open a new session"
            )
        conn.client.use_session(record.upstream, record.replica)

    async def _pin(
        self, sp: SpacePool, client: SpaceClient, record: SessionRecord
    ) -> SessionRecord:
        """Pin an unpinned session to the Space that admitted its call, on the replica
        this first request reaches; the record as stored after (another call of the
        session may have pinned it first: to another Space, InvalidRequest)."""
        app_id, replica = await self._current_app_id(sp, client, (), first=True)
        pinned = dataclasses.replace(record, space=sp.name, app_id=app_id, replica=replica)

        def pin(raw: str | None) -> str | None:
            if raw is None:
                return None
            now = SessionRecord.loads(record.key, raw)
            return pinned.dumps() if now.space is None else None

        stored = await self._values().update(record.key, pin, self._idle(record))
        if stored is None:
            raise SessionNotFound("the session ended while its call was admitted")
        now = SessionRecord.loads(record.key, stored)
        if now.space != sp.name:
            raise InvalidRequest(f"the session is on Space {now.space!r} now, not {sp.name!r}")
        return now

    @staticmethod
    async def _current_app_id(
        sp: SpacePool, client: SpaceClient, replica: Replica, first: bool = False
    ) -> tuple[Any, Replica]:
        """The ``app_id`` of the session's replica now (asked through its cookies),
        with those cookies. One never seen on the Space makes its connections be
        rebuilt, unless it is the first answer of a new session and the home replica
        still answers a known one (a replica met: pool/connections/_replicas.py)."""
        answer = await client.replica_app_id(replica)
        if answer is None:  # not answering: the call itself will fail over or fail
            return client.app_id, replica
        current, replica = answer
        if sp.replicas.known(current):
            return current, replica
        home = await client.replica_app_id(None) if first else None
        if home is not None and sp.replicas.known(home[0]):
            sp.replicas.note(current)  # the home replica runs on: another replica, met
        elif sp.replicas.is_restart(current):
            sp.restarted(current)
        return current, replica
