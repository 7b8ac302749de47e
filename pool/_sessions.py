"""Sessions: one Space and one upstream Gradio session, kept across calls.

A session pins one Space and one ``session_hash`` there, so that the app's
``gr.State`` (a ``gr.ChatInterface``'s history, for instance) lives across the
session's calls exactly as in a browser tab of that Space. Between calls it holds
nothing: no admission slot, no connection, no heartbeat. Each call is admitted like
any other, checks out any connection of the Space and continues the session there
(:meth:`pool._native.NativeClient.use_session`; a fallback ``gradio_client.Client``
gets the ``session_hash``); when the call ends the connection goes back and the
session is retired from it, as after every lease: its data stream and its heartbeat
end. Gradio keeps a session's state while its heartbeat is open and for an hour after
it ends (gradio/routes.py ``heartbeat``, gradio/state_holder.py
``STATE_TTL_WHEN_CLOSED``), so the heartbeat runs only while a call needs it.

The record lives in the coordinator's shared values (``session:<sha256 of the id>``),
so every worker and host of the fleet serves the session's calls. Its TTL is
``POOL_SESSION_IDLE_S``, renewed by every call: a session expires after that long
without one. The id is a random token (the only credential of an anonymous session);
the record keeps the keyed hash of the email that opened it, and a call under another
identity is answered as for an unknown id (:class:`SessionNotFound`).

A Space that restarted has lost every session: each call first asks the Space for its
``app_id`` (``gradio_api/app_id``, a few bytes); one that differs from the session's
is :class:`SessionLost` and the session is deleted — never a fresh state in silence.

How many sessions one user holds open is counted fleet-wide (pool/_holdings.py,
``sessions-held:<user>``, every anonymous caller together as one user): ``open`` with a
``limit`` refuses a user at it with :class:`~pool.UserLimitReached`
(``too_many_sessions``, ``retry_after_s`` until the first of theirs expires unused).
A session leaves the count when it is closed or lost, or, having expired, when the user
is next at the limit; a session in use re-writes the count at least once per
``POOL_SESSION_IDLE_S`` (``indexed``), so the count never expires before it does.

A replicated Space keeps a session on one replica through cookies
(pool/transport/_affinity.py): the session's first request (that ``app_id`` question,
when it is opened) reaches some replica, whose cookies the record keeps (``replica``),
so every later call of the session, on any connection or worker, reaches it again, and
the ``app_id`` compared is that replica's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import secrets
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from ._connection import Connection
from ._exceptions import InvalidRequest, SessionLost, SessionNotFound, UnknownSpace
from ._holdings import Holdings
from ._native import NativeClient
from ._space_pool import SpacePool
from .transport import Affinity

if TYPE_CHECKING:
    from ._pool import Pool

_PREFIX = "session:"
_HELD = "sessions-held:"  # sessions-held:<user> → the keys of their open sessions
_OPENING_S = 120.0  # a session is being opened this long at most (connect, app_id)


@dataclass(frozen=True)
class PoolSession:
    """An open session: pass it (or its ``id``) as ``session=`` to ``predict``/``client``."""

    id: str
    space: str
    expires_at: float  # wall clock (seconds since the epoch): no call until then, it ends

    def __str__(self) -> str:
        return self.id


@dataclass(frozen=True)
class SessionRecord:
    """What the fleet knows of one session (no secret: the id is only hashed in)."""

    key: str
    space: str
    upstream: str  # the session_hash on the Space
    owner: str | None  # keyed hash of the email that opened it; None: anonymous
    app_id: Any
    used: float  # wall clock of the last call (or the opening)
    replica: tuple[tuple[str, str, str, str], ...] = ()  # the replica's cookies (Affinity)
    indexed: float = 0.0  # wall clock when the owner's count was last re-written for it

    def dumps(self) -> str:
        return json.dumps({"space": self.space, "upstream": self.upstream,
                           "owner": self.owner, "app_id": self.app_id,
                           "used": self.used, "replica": self.replica,
                           "indexed": self.indexed})  # fmt: skip

    def renewed(self, used: float) -> SessionRecord:
        return dataclasses.replace(self, used=used)


def _cookies(raw: Any) -> tuple[tuple[str, str, str, str], ...]:
    """A record's ``replica`` back from JSON (lists of four strings)."""
    return tuple((str(n), str(v), str(d), str(p)) for n, v, d, p in raw)


def _key(session_id: str) -> str:
    return _PREFIX + hashlib.sha256(session_id.encode()).hexdigest()[:32]


class Sessions:
    """Opens, finds, renews and ends sessions; attaches one to a leased connection."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    @property
    def idle_s(self) -> float:
        return self._pool.settings.session_idle_s

    @functools.cached_property
    def held(self) -> Holdings:
        """The sessions each user holds open, fleet-wide (see the module docstring)."""
        pool = self._pool
        return Holdings(
            lambda: pool.coordinator.values, _HELD, what="sessions",
            ttl_s=4 * self.idle_s, grace_s=_OPENING_S, clock=pool.clock.wall,
        )  # fmt: skip

    async def open(
        self, email: str | None, space: str | None = None, *, limit: int | None = None
    ) -> PoolSession:
        """A new session for ``email`` (None: anonymous) on ``space`` or on the Space
        the caller is routed to (their pin, else round-robin / least loaded). The
        Space is connected to (no admission slot) to learn its ``app_id``. ``limit``:
        the sessions one user may hold open (every anonymous caller together counting
        as one); at it, :class:`~pool.UserLimitReached` before anything is connected."""
        pool = self._pool
        await pool.start()
        user = pool.hash_user(email)
        session_id = secrets.token_urlsafe(24)
        key = _key(session_id)
        await self.held.take(user, key, limit, self._lasts)
        try:
            return await self._open(user, space, session_id)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.held.drop(user, key)
            raise

    async def _lasts(self, key: str) -> float | None:
        """How long the session under ``key`` lasts at most unused; None: it ended."""
        raw = await self._pool.coordinator.values.get(key)
        if raw is None:
            return None
        try:
            used = float(json.loads(raw)["used"])
        except (ValueError, KeyError, TypeError):
            return math.inf
        return used + self.idle_s - self._pool.clock.wall()

    async def _open(self, user: str | None, space: str | None, session_id: str) -> PoolSession:
        pool = self._pool
        if space is None:
            usable = [n for n, sp in pool.spaces.items()
                      if sp.is_up() and pool.board.get(n).admits()]  # fmt: skip
            space = pool.router.candidates(user, usable, lambda n: pool.spaces[n].load())[0]
        elif space not in pool.spaces:
            raise UnknownSpace(space, list(pool.spaces))
        sp = pool.spaces[space]
        async with pool.clock.timeout(None):  # real I/O, bounded by the connect timeout
            conn = await sp.checkout()
        affinity = Affinity()  # the replica this first request reaches is the session's
        try:
            app_id = await self._current_app_id(sp, conn, affinity, first=True)
        finally:
            sp.checkin(conn, discard=False)
        now = pool.clock.wall()
        record = SessionRecord(_key(session_id), space, uuid.uuid4().hex, user, app_id, now,
                               tuple(affinity.saved()), indexed=now)  # fmt: skip
        await pool.coordinator.values.put(record.key, record.dumps(), self.idle_s)
        return PoolSession(session_id, space, now + self.idle_s)

    async def _load(self, session: str | PoolSession, email: str | None) -> SessionRecord:
        session_id = session.id if isinstance(session, PoolSession) else str(session)
        key = _key(session_id)
        raw = await self._pool.coordinator.values.get(key)
        missing = SessionNotFound(f"no session {session_id[:8]}… here (unknown or expired)")
        if raw is None:
            raise missing
        try:
            data = json.loads(raw)
            record = SessionRecord(key, str(data["space"]), str(data["upstream"]),
                                   data["owner"], data["app_id"], float(data["used"]),
                                   _cookies(data.get("replica", ())),
                                   float(data.get("indexed", 0.0)))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            raise missing from None
        if record.owner != self._pool.hash_user(email) or record.space not in self._pool.spaces:
            raise missing
        return record

    def view(self, session: str | PoolSession, record: SessionRecord) -> PoolSession:
        session_id = session.id if isinstance(session, PoolSession) else str(session)
        return PoolSession(session_id, record.space, record.used + self.idle_s)

    async def get(self, session: str | PoolSession, email: str | None) -> PoolSession:
        """The live session (SessionNotFound if unknown, expired or not the caller's)."""
        await self._pool.start()
        return self.view(session, await self._load(session, email))

    async def close(self, session: str | PoolSession, email: str | None) -> None:
        """End the session (SessionNotFound as :meth:`get`). Nothing of it runs upstream
        between calls; the Space drops its state by its own rule (an hour)."""
        await self._pool.start()
        record = await self._load(session, email)
        await self._pool.coordinator.values.delete(record.key)
        await self.held.drop(record.owner, record.key)

    async def resolve(
        self, session: str | PoolSession, email: str | None, space: str | None
    ) -> SessionRecord:
        """The session of a call, renewed for another ``POOL_SESSION_IDLE_S``."""
        record = await self._load(session, email)
        if space is not None and space != record.space:
            raise InvalidRequest(
                f"the session is on Space {record.space!r}, not {space!r}: leave space out"
            )
        now = self._pool.clock.wall()
        renewed = record.renewed(now)
        if now - record.indexed >= self.idle_s:  # the owner's count outlives the session
            await self.held.keep(record.owner, record.key)
            renewed = dataclasses.replace(renewed, indexed=now)
        await self._pool.coordinator.values.put(renewed.key, renewed.dumps(), self.idle_s)
        return renewed

    async def attach(self, sp: SpacePool, conn: Connection, record: SessionRecord) -> None:
        """Continue ``record``'s upstream session on the leased ``conn``; SessionLost
        (and the session deleted) if the Space restarted since it was opened."""
        affinity = Affinity(record.replica)
        if await self._current_app_id(sp, conn, affinity) != record.app_id:
            with contextlib.suppress(Exception):
                await self._pool.coordinator.values.delete(record.key)
                await self.held.drop(record.owner, record.key)
            raise SessionLost(
                f"Space {sp.name!r} restarted since the session was opened: its state is"
                " gone; open a new session"
            )
        client = conn.client
        if isinstance(client, NativeClient):
            client.use_session(record.upstream, affinity)
        else:  # a gradio_client.Client: its jobs carry client.session_hash
            client.session_hash = record.upstream

    async def _current_app_id(
        self, sp: SpacePool, conn: Connection, affinity: Affinity, first: bool = False
    ) -> Any:
        """The ``app_id`` of the session's replica now (native: asked through its
        cookies; fallback: the connection's). One never seen on the Space makes its
        connections be rebuilt, unless it is the first answer of a new session and the
        home replica still answers a known one (a replica met: pool/_replicas.py)."""
        client = conn.client
        if not isinstance(client, NativeClient):
            return conn.app_id
        try:
            url = client.app.url("app_id")
            response = await affinity.send(client.transport.http, "GET", url)
            response.raise_for_status()
            current = response.json().get("app_id")
        except (httpx.HTTPError, ValueError):
            return conn.app_id  # not answering: the call itself will fail over or fail
        if sp.replicas.known(current):
            return current
        if first and await self._home_unchanged(sp, client):
            sp.replicas.note(current)  # the home replica runs on: another replica, met
        elif sp.replicas.is_restart(current):
            sp.restarted(current)
        return current

    @staticmethod
    async def _home_unchanged(sp: SpacePool, client: NativeClient) -> bool:
        """Whether the replica the pool's own requests reach still answers a known
        ``app_id`` (then a new one a session met is another replica, not a restart)."""
        with contextlib.suppress(httpx.HTTPError, ValueError):
            url = client.app.url("app_id")
            response = await client.transport.home.send(client.transport.http, "GET", url)
            response.raise_for_status()
            return sp.replicas.known(response.json().get("app_id"))
        return False
