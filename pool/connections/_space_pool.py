"""The connections of one Space inside this process.

State is three collections — ``_idle`` (LIFO: the most recently used connection is
handed out first, so extras above the minimum grow idle and get reaped), ``_leased``
and ``_waiters`` (FIFO futures) — plus a count of connections being opened. Every
state change is a plain method without ``await``; opening and closing connections
run as background tasks that call back into those methods.

Admission (the coordinator) already bounds how many requests of this process reach
a Space at once, so waiting here is short: a request waits only for a connection
that is being opened or returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Mapping
from typing import Any

import httpx

from .._clock import SYSTEM_CLOCK, Clock
from .._exceptions import PoolClosedError, PoolError, UpstreamTransportError
from .._spaces import SpaceSpec
from ..resilience import RetryPolicy
from ..transport import SpaceClient, SpaceOpener, classify_connect
from ._connection import Connection, ConnState
from ._pacing import JoinPacer
from ._replicas import Replicas

_ACLOSE_CANCEL_WAIT_S = 1.0  # aclose(): how long job cancels may take to reach a Space
_log = logging.getLogger("spacepool")


class SpacePool:
    """Connections to one Space: lazy start, growth to ``max_size``, hand-off, reaping."""

    def __init__(
        self,
        spec: SpaceSpec,
        *,
        min_size: int,
        max_size: int,
        opener: SpaceOpener,
        reopen: RetryPolicy | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.spec = spec
        self.min_size = min_size
        self.max_size = max_size
        self._opener = opener
        # Opening a connection again after a failure the table calls ``reopen``.
        self._reopen = reopen or RetryPolicy(3, 0.5, 4.0)
        self._clock = clock
        self._idle: list[Connection] = []
        self._leased: set[Connection] = set()
        self._settling = 0
        self._opening = 0
        self._waiters: deque[asyncio.Future[Connection | None]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.generation = 0
        self.app_id: object = None
        self.replicas = Replicas()  # every app_id seen: pool/connections/_replicas.py
        self.pacer = JoinPacer()  # its joins, one at a time once it refused one (_pacing.py)
        self.probe_url: str | None = (
            spec.src + "gradio_api/app_id" if spec.src.startswith("http") else None
        )
        self.down_until = 0.0
        self.last_error: str | None = None
        # The Space's own queue as the last call that saw an ``estimation`` found it.
        self.space_queue: dict[str, Any] | None = None
        self.opened_total = 0
        # The Space's api_names, from its config when a connection last opened (None:
        # not known yet); routing sends a call only where its endpoint exists.
        self.api_names: frozenset[str] | None = None
        # api_name → digest of its parameters and outputs (pool/routing/_apps.py: apps, replicas).
        self.signatures: dict[str, str] | None = None
        # Warmth (pool/connections/_warmth.py): the peak in use since it was last taken, and how
        # many connections the reaper keeps open (at least the minimum).
        self._peak_in_use = 0
        self.kept_warm = min_size

    # -- predicates -------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def total(self) -> int:
        return len(self._idle) + len(self._leased) + self._settling

    def is_up(self) -> bool:
        return self._clock.now() >= self.down_until

    def may_serve(self, api_name: str | None) -> bool:
        """Whether the Space has ``api_name``, as far as this process knows (a Space not
        connected yet may)."""
        return api_name is None or self.api_names is None or api_name in self.api_names

    def load(self) -> float:
        """In-use share of capacity, counting local waiters: the least-loaded metric."""
        return (len(self._leased) + len(self._waiters)) / self.max_size

    # -- checkout / checkin -------------------------------------------------------------
    async def checkout(self) -> Connection:
        """An exclusive connection: an idle one, else one opened or returned for us."""
        while True:
            self._ensure_open()
            conn = self._take_idle()
            if conn is not None:
                return conn
            fut: asyncio.Future[Connection | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            self._grow()
            try:
                got = await fut
            except BaseException:
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    handed = fut.result()
                    if handed is not None:
                        self.checkin(handed, discard=False)
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(fut)
                    fut.cancel()
                raise
            if got is not None:
                return got
            # None: an open failed while others may still succeed; look again.

    def checkin(self, conn: Connection, *, discard: bool) -> None:
        """Give ``conn`` back; a discarded or stale one is closed and replaced."""
        if self._closed and conn.state is ConnState.CLOSED:
            return  # returned after aclose(), which closed it already
        self._leased.discard(conn)
        conn.last_used = self._clock.now()
        if discard or self._closed or conn.generation != self.generation:
            self._close_later(conn)
            self._top_up()
            self._grow()
            return
        if not conn.client.settled():
            # The last lease's result stream is still closing; a new session's jobs
            # would get no reader until it does (docs/gradio-protocol.md §4). Settle first.
            self._settling += 1
            conn.state = ConnState.CLOSED  # not handed out while settling
            self._spawn(self._settle(conn))
            return
        self._reset_and_deliver(conn)

    def _reset_and_deliver(self, conn: Connection) -> None:
        conn.client.reset_session()  # a fresh upstream session: no gr.State crosses users
        conn.state = ConnState.IDLE
        self._deliver(conn)

    async def _settle(self, conn: Connection) -> None:
        try:
            settled = await conn.client.settle()
        finally:
            self._settling -= 1
        if not settled or self._closed:
            self._close_later(conn)
            self._top_up()
            self._grow()
        else:
            self._reset_and_deliver(conn)

    def _take_idle(self) -> Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.generation != self.generation:
                self._close_later(conn)
                continue
            conn.state = ConnState.LEASED
            self._leased.add(conn)
            self._peak_in_use = max(self._peak_in_use, len(self._leased))
            return conn
        return None

    def _deliver(self, conn: Connection) -> None:
        """Hand ``conn`` to the oldest live waiter, else park it as idle."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                conn.state = ConnState.LEASED
                self._leased.add(conn)
                self._peak_in_use = max(self._peak_in_use, len(self._leased))
                fut.set_result(conn)
                return
        conn.state = ConnState.IDLE
        self._idle.append(conn)

    # -- opening -------------------------------------------------------------------------
    def _ensure_open(self) -> None:
        if self._closed:
            raise PoolClosedError("pool closed")

    def _grow(self) -> None:
        """Open connections for waiters that no returning connection will serve."""
        live = sum(1 for f in self._waiters if not f.done())
        while live > self._opening and self.total + self._opening < self.max_size:
            self._start_open()

    def _top_up(self) -> None:
        """Keep at least ``min_size`` once the Space has been used."""
        if self.opened_total == 0 or not self.is_up():
            return
        while self.total + self._opening < self.min_size:
            self._start_open()

    def warm_up(self) -> None:
        """Open connections up to ``min_size`` now (``POOL_WARMUP``), in the background."""
        if not self._closed:
            while self.total + self._opening < self.min_size:
                self._start_open()

    def take_peak_in_use(self) -> int:
        """The most connections in use at once since the last call (and reset it)."""
        peak, self._peak_in_use = self._peak_in_use, len(self._leased)
        return max(peak, len(self._leased))

    def _start_open(self) -> None:
        self._opening += 1
        self._spawn(self._open())

    async def _open(self) -> None:
        generation = self.generation
        try:
            client = await self._connect()
        except PoolError as exc:
            self._opening -= 1
            self._open_failed(exc)
            return
        except BaseException:
            self._opening -= 1
            raise
        self._opening -= 1
        if self._closed or generation != self.generation:
            # Closed, or marked down / restarted while we were connecting: this
            # connection belongs to a past generation and proves nothing now.
            await self._close(Connection(client, generation, self._clock.now()))
            self._grow()
            return
        conn = Connection(client, self.generation, self._clock.now())
        first = self.opened_total == 0
        self.opened_total += 1
        self.down_until = 0.0
        self.last_error = None
        if self.app_id is None or first:
            self.app_id = conn.app_id
            self.replicas.note(conn.app_id)
        elif conn.app_id != self.app_id and self.replicas.is_restart(conn.app_id):
            # The Space restarted since our other connections were made.
            self.app_id = conn.app_id
            self.generation += 1
            conn.generation = self.generation
            self._drop_stale_idle()
        self.probe_url = conn.probe_url()
        self.api_names = frozenset(conn.client.api_names())
        self.signatures = conn.signatures()
        self._deliver(conn)
        self._top_up()

    def _open_failed(self, exc: PoolError) -> None:
        self.last_error = exc.kind
        if self.total + self._opening > 0 and self.is_up():
            # Others may still serve the waiters; let them look again.
            for fut in list(self._waiters):
                if not fut.done():
                    fut.set_result(None)
                    break
            self._waiters = deque(f for f in self._waiters if not f.done())
            return
        waiters, self._waiters = self._waiters, deque()
        for fut in waiters:
            if not fut.done():
                fut.set_exception(exc)

    async def _connect(self) -> SpaceClient:
        attempt = 0
        while True:
            attempt += 1
            self._ensure_open()
            try:
                return await self._opener.open(self.spec.src)
            except PoolClosedError:
                raise
            except Exception as exc:
                if self._closed:  # cut by aclose(): no retry
                    raise PoolClosedError("pool closed while opening") from exc
                error = classify_connect(exc).error
                if not self._reopen.should_reopen(error, attempt) or _asked_to_wait(error):
                    raise error from exc  # a Retry-After is honoured by routing around
            await self._clock.sleep(self._reopen.delay(attempt))

    # -- health, restart, reaping -------------------------------------------------------------
    def mark_down(self, kind: str, cooldown_s: float) -> None:
        """The Space failed: route around it for ``cooldown_s``, drop idle connections."""
        self.last_error = kind
        self.down_until = self._clock.now() + cooldown_s
        self.generation += 1
        self._drop_stale_idle()
        # Callers waiting here for a connection fail over now: opens that go on failing
        # against a dead Space would otherwise hand each other's waiters back and forth.
        waiters, self._waiters = self._waiters, deque()
        down = UpstreamTransportError(
            f"Space {self.name!r} is down ({kind})", kind=kind, before_accept=True
        )
        for fut in waiters:
            if not fut.done():
                fut.set_exception(down)

    def restarted(self, app_id: object) -> None:
        """The Space's ``app_id`` changed: rebuild every connection."""
        self.app_id = app_id
        self.replicas.note(app_id)
        self.generation += 1
        self._drop_stale_idle()
        self._top_up()

    def _drop_stale_idle(self) -> None:
        stale = [c for c in self._idle if c.generation != self.generation]
        self._idle = [c for c in self._idle if c.generation == self.generation]
        for conn in stale:
            self._close_later(conn)

    def busy(self) -> bool:
        """Leased connections or local waiters (work this process is doing here)."""
        return bool(self._leased) or any(not f.done() for f in self._waiters)

    def drop_idle(self) -> None:
        """Close every idle connection (the Space is being paused); no top-up."""
        self.generation += 1
        self._drop_stale_idle()

    def current_connection(self) -> Connection | None:
        """Any live connection of the current generation (to read its metadata only)."""
        for conn in [*reversed(self._idle), *self._leased]:
            if conn.generation == self.generation and conn.state is not ConnState.CLOSED:
                return conn
        return None

    def idle_sample(self, count: int) -> list[Connection]:
        """Up to ``count`` idle connections, least recently used first."""
        return self._idle[:count]

    def discard_idle(self, conn: Connection) -> bool:
        """Close an idle connection (failed probes); False if it is leased now."""
        if conn in self._idle:
            self._idle.remove(conn)
            self._close_later(conn)
            self._top_up()
            return True
        return False

    def reap_idle(self, idle_timeout_s: float, keep: int | None = None) -> int:
        """Close connections idle longer than ``idle_timeout_s``, down to ``keep``
        (default: the minimum; pool/connections/_warmth.py decides it)."""
        now = self._clock.now()
        reaped = 0
        floor = self.min_size if keep is None else keep
        for conn in list(self._idle):  # oldest first
            if self.total <= floor:
                break
            if conn.is_idle_longer_than(idle_timeout_s, now):
                self._idle.remove(conn)
                self._close_later(conn)
                reaped += 1
        return reaped

    async def probe(
        self, http: httpx.AsyncClient, url: str, headers: Mapping[str, str] | None = None
    ) -> object:
        """``GET …/gradio_api/app_id``: the Space's current app id (raises on failure);
        ``headers``: the connection's cookies (:meth:`Connection.probe_headers`)."""
        response = await http.get(url, headers=headers)
        response.raise_for_status()
        return response.json().get("app_id")

    # -- closing ---------------------------------------------------------------------------
    def _close_later(self, conn: Connection) -> None:
        conn.state = ConnState.CLOSED
        self._spawn(self._close(conn))

    async def _close(self, conn: Connection) -> None:
        conn.state = ConnState.CLOSED
        if pending := [c for c in conn.cancels if not c.done()]:
            # Let the job cancels reach the Space before their connections are cut (a
            # job cancelled right after submit is cancelled once the Space names it, else
            # the Space would run it to the end, unwatched). While the pool closes, a
            # Space that does not answer must not hold aclose() up.
            wait_s = _ACLOSE_CANCEL_WAIT_S if self._closed else conn.client.cancel_wait_s
            await asyncio.wait(pending, timeout=wait_s)
        await conn.aclose()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close_nowait(self) -> None:
        """Refuse new work, fail the waiters, start closing every connection."""
        self._closed = True
        for fut in self._waiters:
            if not fut.done():
                fut.set_exception(PoolClosedError("pool closed"))
        self._waiters.clear()
        conns = self._idle + list(self._leased)
        self._idle, self._leased = [], set()
        for conn in conns:
            self._close_later(conn)

    async def aclose(self) -> None:
        """Close every connection (waiters get :class:`PoolClosedError`); return once
        they are closed, their threads ended, and the connections being opened too."""
        self.close_nowait()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -- statistics ------------------------------------------------------------------------------
    def snapshot(self, max_failures: int) -> dict[str, Any]:
        conns = self._idle + list(self._leased)
        unhealthy = sum(1 for c in conns if not c.is_healthy(max_failures) or c.failures)
        return {
            "totalConnections": self.total,
            "availableConnections": len(self._idle),
            "inUseConnections": len(self._leased),
            "openingConnections": self._opening,
            "healthyConnections": len(conns) - unhealthy,
            "unhealthyConnections": unhealthy,
            "localWaiters": sum(1 for f in self._waiters if not f.done()),
            "keptWarm": self.kept_warm,
            "up": self.is_up(),
            "lastError": self.last_error,
            "generation": self.generation,
            "spaceQueue": self.space_queue,
        }

    def saw_queue(self, rank: int, size: int | None, at: float) -> None:
        """A call found the Space's own queue so (rank 0 = next) before it started."""
        self.space_queue = {"rank": rank, "size": size, "seenAt": round(at, 3)}


def _asked_to_wait(error: PoolError) -> bool:
    """The Space named a wait (429 Retry-After): no reopen before it passed."""
    return isinstance(error, UpstreamTransportError) and bool(error.retry_after_s)
