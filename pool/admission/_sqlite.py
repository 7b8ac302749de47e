"""Host-wide store (``sqlite:///abs/path.db``): the processes of one machine share a file.

This is the embedded default, safe when ``uvicorn --workers N`` runs several
processes. The whole fleet state lives in the file::

    limits(resource, lim)                         a name or a prefix ("consumer:")
    waiters(seq AUTOINCREMENT, id, owner, resources, ttl_s, enqueued_at, expires_at,
            lane, rank, ages_at)                  lane, class: see _rule (issue 18)
    leases(id, owner, resources, ttl_s, granted_at, expires_at)
    stats(key, value)                             mean_hold_s (EWMA over releases)
    secret(id = 1, key)                           created once, read by everyone
    shared_values(ns, key, value, expires_at)     shared values, apart from admission
    meta(key, value)                              quarantine: no grant before this time
    gone(id, expires_at)                          tombstones of ids that left the store

``seq`` is the arrival order, fleet-wide. Holder counts (``held``) and the
per-resource queues used for positions are kept by triggers on ``leases`` and
``waiters``, in the same transaction as the row that justifies them, so they cannot
drift from it whichever statement inserts or deletes the row; the grant index
(``parked``, ``woken``: :mod:`pool.admission._sqlite_index`) is kept the same way by
the calls that change the waiters.

Why it is shaped this way:

* **Every decision inside the write lock.** Every mutation (enqueue, release,
  withdraw, set_limits, drop) runs in a ``BEGIN IMMEDIATE`` transaction: it applies
  the change, deletes expired leases and waiters (waking what they held), then runs
  the grant pass of :mod:`pool.admission._sqlite_index` (the rule kept as indexes in
  the file: only the lanes parked under a resource freed since the last pass, and the
  new ones, are read; issue 39) and turns the winners' rows into leases (same id). The
  write lock is the fleet's critical section; the pass has no ``await``.
* **Whoever commits, grants.** The process that frees a slot hands it to the head
  waiter whatever process that waiter belongs to; the owner discovers the lease on
  its next poll. Polls are read-only (``SELECT id FROM leases WHERE id IN (...)``)
  and cheap in WAL mode, where readers never block the writer; a poll upgrades to a
  write transaction only when some entry's ``expires_at`` has passed (a crashed
  process) or once a second as a safety net.
* **A dedicated thread, group commit.** sqlite3 calls block, so each coordinator owns
  one worker thread and one connection. Store calls are queued to it in order (a
  withdraw reaches the file after its enqueue); each round the thread commits every
  queued write call in one transaction, one savepoint per call, so concurrent callers
  share the thread hop and the commit.
* **Fail closed.** ``busy_timeout`` bounds how long a transaction waits for the write
  lock (``?busy_timeout_ms=``, default 2000). Beyond it, or when the file cannot be
  opened, the call raises :class:`StoreUnavailable`, which the coordinator turns into
  ``BusyError(reason="coordinator_unavailable")``. Granted leases keep running; they
  are renewed again once the file answers.

* **A late command cannot act.** Every id that leaves the store (withdrawn,
  released, dropped, expired) leaves a row in ``gone`` for at least one lease TTL
  (the longest TTL of the ids it buries), and an enqueue or a re-registration of a
  buried id does nothing. SQLite calls are not abandoned on timeout as Redis's are,
  but a call queued to the worker thread still runs after its caller gave up; the
  rule is the same for both stores (``tests/admission/test_stale_commands.py``).

* **A file deleted or replaced under us.** A process keeps using the inode it
  opened, so a deleted or replaced file would split the fleet in two. Each round the
  worker compares the path's inode with the open one; when they differ it reopens
  the path and, before any other call, the process re-registers its limits, its live
  leases (only into free slots: a lease whose slot was taken is reported lost and
  fenced) and its queued waiters, in order, and sets a *quarantine* of one lease TTL
  in the file, during which nothing new is granted: every process that held slots
  in the old file renews within that time, notices and re-registers, or reaches
  its local expiry and fences itself. Left open: a process that never opened the old
  file, and is the first to reach the new one, is not held back by that quarantine.

Expiry uses the wall clock (``time.time()``): it is shared by every process of the
host, and unlike ``CLOCK_MONOTONIC`` it survives a reboot with the file on disk. A
wall-clock step forward expires leases early in the file while their holders'
(monotonic) local expiry has not passed: keep the host's clock slewed, not stepped.
Options: ``?busy_timeout_ms=2000&poll_ms=10``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast
from urllib.parse import parse_qs, urlsplit

from .._threads import wait_ended
from . import _sqlite_index as index
from ._lease_keeper import (
    LocalEntries,
    SharedCoordinator,
    StoreView,
    Withdrawn,
)
from ._protocol import AdmissionSnapshot, StoreUnavailable, new_id
from ._rule import INTERACTIVE, RANK, lane_of, limit_lookup
from ._sqlite_values import SCHEMA as VALUES_SCHEMA
from ._sqlite_values import SQLiteValues
from ._store_layout import check_sqlite_layout

T = TypeVar("T")
_log = logging.getLogger("spacepool.admission")

_SAFETY_PASS_S = 1.0  # a poll runs a full write pass at least this often
_BATCH = 64  # at most this many store calls share one transaction
_POSITIONS_EVERY_S = 0.25  # how often a poll refreshes the waiters' positions
_POSITIONS_PER_POLL = 32  # how many of them (each in turn), at most
_CLOSE_WAIT_S = 5.0  # close() waits this long at most for the worker thread (a busy file)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS limits (resource TEXT PRIMARY KEY, lim INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS waiters (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        owner TEXT NOT NULL,
        resources TEXT NOT NULL,
        ttl_s REAL NOT NULL,
        enqueued_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        lane TEXT NOT NULL DEFAULT '',
        rank INTEGER NOT NULL DEFAULT 0,
        ages_at REAL NOT NULL DEFAULT 0)""",
    "CREATE INDEX IF NOT EXISTS waiters_expiry ON waiters(expires_at)",
    """CREATE TABLE IF NOT EXISTS leases (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        resources TEXT NOT NULL,
        ttl_s REAL NOT NULL,
        granted_at REAL NOT NULL,
        expires_at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS leases_expiry ON leases(expires_at)",
    "CREATE TABLE IF NOT EXISTS stats (key TEXT PRIMARY KEY, value REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS secret (id INTEGER PRIMARY KEY CHECK (id = 1), key BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value REAL NOT NULL)",
    # Tombstones (issue 22): ids that left the store, refused until expires_at.
    "CREATE TABLE IF NOT EXISTS gone (id TEXT PRIMARY KEY, expires_at REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS gone_expiry ON gone(expires_at)",
    *VALUES_SCHEMA,
)

_IDS = "(SELECT value FROM json_each(?))"  # a JSON array parameter as a set of ids


class SQLiteCoordinator(SharedCoordinator):
    """Admission shared by the processes of one host through one SQLite file."""

    def __init__(self, url: str, *, lease_ttl_s: float = 15.0, count_work: bool = False) -> None:
        path, busy_timeout_s, poll_s = _parse_url(url)
        self.path = path
        self._store = _SQLiteStore(
            path,
            owner=new_id(),
            lease_ttl_s=lease_ttl_s,
            busy_timeout_s=busy_timeout_s,
            poll_interval_s=poll_s,
            count_work=count_work,
        )
        super().__init__(self._store, lease_ttl_s=lease_ttl_s)

    @property
    def work(self) -> int:
        """SQLite virtual-machine steps run so far, in hundreds (``count_work=True``
        only: tests/admission/test_work.py)."""
        return self._store.work


def _parse_url(url: str) -> tuple[str, float, float]:
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc or not parts.path.strip("/"):
        raise ValueError(f"expected sqlite:///absolute/path.db, got {url!r}")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(query) - {"busy_timeout_ms", "poll_ms"}
    if unknown:
        raise ValueError(f"unknown sqlite coordinator option(s): {', '.join(sorted(unknown))}")
    path = "/" + parts.path.lstrip("/")
    busy_timeout_s = float(query.get("busy_timeout_ms", 2000)) / 1000
    poll_s = float(query.get("poll_ms", 10)) / 1000
    return path, busy_timeout_s, poll_s


@dataclass
class _Job:
    """One store call queued to the worker thread."""

    run: Callable[[sqlite3.Connection, float], Any]
    kind: Literal["write", "read", "close"]  # writes share the round's transaction
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    restore: bool = False  # runs while the others wait for a re-registration


class _StoreReset(Exception):
    """The file was deleted or replaced: re-register, then try the call again."""


class _SQLiteStore:
    """The file and its transactions; ``_serve`` and below run on the worker thread.

    Each round, the worker takes every call queued since the last one and commits
    all the writing calls in ONE ``BEGIN IMMEDIATE`` transaction (group commit), each
    in its own savepoint so that a failing call does not undo the others. Concurrent
    callers thus share the thread hop, the write lock and the commit, which is what
    bounds throughput; each call still sees the effects of the calls before it.
    """

    name = "sqlite"

    def __init__(
        self,
        path: str,
        *,
        owner: str,
        lease_ttl_s: float,
        busy_timeout_s: float,
        poll_interval_s: float,
        count_work: bool = False,
    ) -> None:
        self.path = path
        self.work = 0
        self._count_work = count_work
        self._turn = 0  # where the next poll's positions start among the waiting ids
        self.poll_interval_s = poll_interval_s
        self._owner = owner
        self._ttl = lease_ttl_s
        self._busy_timeout_s = busy_timeout_s
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._secret: bytes | None = None
        self._local: LocalEntries | None = None
        self._limits_set: dict[str, int] = {}
        # Worker-thread state:
        self._conn: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._reset_pending = False  # the file changed: only a restore may run
        self._next_safety_pass = 0.0
        self._next_positions = 0.0
        self.values = SQLiteValues(self._transact, self._read)

    def attach(self, local: LocalEntries) -> None:
        """Whose entries to re-register if the file is ever deleted or replaced."""
        self._local = local

    async def watch(
        self, on_grant: Callable[[Iterable[str]], None], on_resume: Callable[[], None]
    ) -> None:
        """No push channel: owners discover remote grants by polling."""

    # -- async surface ---------------------------------------------------------------------
    async def _submit(
        self,
        run: Callable[[sqlite3.Connection, float], T],
        kind: Literal["write", "read", "close"],
        *,
        restore: bool = False,
    ) -> T:
        for _ in range(3):
            try:
                return await self._submit_once(run, kind, restore)
            except _StoreReset:
                await self._restore()
        raise StoreUnavailable(f"sqlite {self.path}: the file keeps being replaced")

    async def _restore(self) -> None:
        """Re-register this process's limits, live leases and waiters in a new file."""
        leases, waiters = self._local.local_entries() if self._local else ([], [])
        limits, secret, ttl = list(self._limits_set.items()), self._secret, self._ttl

        def restore(conn: sqlite3.Connection, now: float) -> list[str] | None:
            return self._restore_in(conn, now, ttl, limits, secret, leases, waiters)

        refused = await self._submit(restore, "write", restore=True)
        if refused is not None:
            _log.warning(
                "sqlite admission store %s was replaced; re-registered %d lease(s) (%d "
                "refused: their slots were taken), %d waiter(s)",
                self.path, len(leases) - len(refused), len(refused), len(waiters),
            )
            if refused and self._local is not None:
                self._local.entries_lost(refused)

    async def _submit_once(
        self,
        run: Callable[[sqlite3.Connection, float], T],
        kind: Literal["write", "read", "close"],
        restore: bool,
    ) -> T:
        if self._closed:  # a late call (a release after aclose) must not reopen the file
            raise StoreUnavailable(f"sqlite {self.path}: store closed")
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._serve, name="spacepool-sqlite", daemon=True
            )
            self._thread.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._jobs.put(_Job(run, kind, loop, future, restore))
        try:
            return cast(T, await future)
        except sqlite3.OperationalError as exc:  # locked beyond busy_timeout, I/O, open
            raise StoreUnavailable(f"sqlite {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            if type(exc) is not sqlite3.DatabaseError:  # integrity/programming: a bug
                raise
            raise StoreUnavailable(f"sqlite {self.path}: {exc}") from exc
        except OSError as exc:  # cannot create the directory
            raise StoreUnavailable(f"sqlite {self.path}: {exc}") from exc

    async def _transact(self, body: Callable[[sqlite3.Connection, float], T]) -> T:
        return await self._submit(body, "write")

    async def _read(self, body: Callable[[sqlite3.Connection], T]) -> T:
        return await self._submit(lambda conn, _now: body(conn), "read")

    async def enqueue(
        self,
        waiter_id: str,
        resources: tuple[str, ...],
        *,
        priority: str = INTERACTIVE,
        ages_after_s: float = 60.0,
    ) -> StoreView:
        rank = RANK[priority]
        return await self._transact(
            lambda c, now: self._enqueue(c, now, waiter_id, resources, (rank, ages_after_s))
        )

    async def withdraw(self, waiter_id: str, *, keep: bool) -> Withdrawn:
        return await self._transact(lambda c, now: self._withdraw(c, now, waiter_id, keep))

    async def release(self, lease_id: str, held_s: float) -> StoreView:
        return await self._transact(lambda c, now: self._release(c, now, lease_id, held_s))

    async def poll(self, waiting: Sequence[str]) -> StoreView:
        ids = list(waiting)
        return await self._read(lambda conn: self._poll(conn, ids))

    async def renew(self, ids: Sequence[str]) -> set[str]:
        wanted = list(ids)
        return await self._transact(lambda c, now: self._renew(c, now, wanted))

    async def drop(self, ids: Sequence[str]) -> None:
        gone = json.dumps(list(ids))
        await self._transact(lambda c, now: self._drop(c, now, gone))

    async def set_limits(self, limits: Mapping[str, int]) -> StoreView:
        self._limits_set.update(limits)  # re-registered if the file is ever replaced
        rows = [(r, int(n)) for r, n in limits.items()]
        return await self._transact(lambda c, now: self._set_limits(c, now, rows))

    async def snapshot(self) -> AdmissionSnapshot:
        return await self._read(self._snapshot)

    async def shared_secret(self) -> bytes:
        if self._secret is None:
            candidate = secrets.token_bytes(32)
            self._secret = await self._transact(lambda c, _now: _secret(c, candidate))
        return self._secret

    async def close(self) -> None:
        """Close the connection (the file's fds) and end the worker thread."""
        await self.values.aclose()
        if self._thread is None:
            self._closed = True
            return
        try:
            await self._submit(lambda _conn, _now: None, "close")
        finally:
            self._closed = True
            self._jobs.put(None)  # the thread closes what a call queued meanwhile reopened
            if await wait_ended([self._thread], _CLOSE_WAIT_S):
                _log.warning("sqlite %s: the worker thread did not end on close", self.path)

    # -- worker thread ---------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                self._close()
                return
            batch = [job]
            while len(batch) < _BATCH:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._jobs.put(None)  # stop after this round
                    break
                batch.append(job)
            outcomes = self._run_writes([j for j in batch if j.kind == "write"])
            outcomes += [self._run_other(j) for j in batch if j.kind != "write"]
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job, bool, Any]]] = {}
            for outcome in outcomes:
                by_loop.setdefault(outcome[0].loop, []).append(outcome)
            for loop, settled in by_loop.items():
                with contextlib.suppress(RuntimeError):  # loop closed: nobody is waiting
                    loop.call_soon_threadsafe(_settle, settled)

    def _run_writes(self, jobs: list[_Job]) -> list[tuple[_Job, bool, Any]]:
        if not jobs:
            return []
        try:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
        except Exception as exc:
            return [(job, False, exc) for job in jobs]
        now = time.time()
        outcomes: list[tuple[_Job, bool, Any]] = []
        try:
            for job in jobs:
                if self._reset_pending and not job.restore:
                    outcomes.append((job, False, _StoreReset()))
                    continue
                conn.execute("SAVEPOINT call")
                try:
                    outcomes.append((job, True, job.run(conn, now)))
                except sqlite3.OperationalError:
                    raise  # the transaction is unusable: every call of the round fails
                except Exception as exc:
                    conn.execute("ROLLBACK TO call")
                    outcomes.append((job, False, exc))
                conn.execute("RELEASE call")
            conn.execute("COMMIT")
        except Exception as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return [(job, False, exc) for job in jobs]
        return outcomes

    def _run_other(self, job: _Job) -> tuple[_Job, bool, Any]:
        try:
            if job.kind == "close":
                self._close()
                return job, True, None
            conn = self._connection()
            if self._reset_pending:
                return job, False, _StoreReset()
            return job, True, job.run(conn, time.time())
        except Exception as exc:
            return job, False, exc

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._identity != _identity(self.path):
            _log.error("sqlite admission store %s was deleted or replaced", self.path)
            self._close()
            self._reset_pending = True
        if self._conn is None:
            os.makedirs(os.path.dirname(self.path) or "/", exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None)
            if self._count_work:
                conn.set_progress_handler(self._counted, 100)
            try:
                _use_wal(conn, self._busy_timeout_s)
                conn.execute("PRAGMA synchronous=NORMAL")
                _write(conn, lambda c, now: _create_schema(c, now, self.path))
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            self._identity = _identity(self.path)
        return self._conn

    def _restore_in(
        self,
        conn: sqlite3.Connection,
        now: float,
        ttl: float,
        limits: list[tuple[str, int]],
        secret: bytes | None,
        leases: list[tuple[str, tuple[str, ...]]],
        waiters: list[tuple[str, tuple[str, ...]]],
    ) -> list[str] | None:
        """Re-register after a reset (see the module doc); None if there was none."""
        if not self._reset_pending:
            return None
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('quarantine', ?) ON CONFLICT (key)"
            " DO UPDATE SET value = max(value, excluded.value)",
            (now + ttl,),
        )
        conn.executemany("INSERT OR IGNORE INTO limits (resource, lim) VALUES (?, ?)", limits)
        if secret is not None:
            _secret(conn, secret)
        held = _held(conn, now)
        limit_of = limit_lookup(_limits(conn))
        refused: list[str] = []
        for key, resources in leases:
            if _is_gone(conn, now, key):
                refused.append(key)  # it left the store: never back (issue 22)
                continue
            if conn.execute("SELECT 1 FROM leases WHERE id = ?", (key,)).fetchone():
                continue
            index.removed(conn, key, now)
            if not all(held.get(r, 0) < limit_of(r) for r in resources):
                refused.append(key)  # its slot was given away meanwhile
                continue
            for r in resources:
                held[r] = held.get(r, 0) + 1
            conn.execute(
                "INSERT INTO leases (id, owner, resources, ttl_s, granted_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (key, self._owner, json.dumps(resources), ttl, now, now + ttl),
            )
        for key, resources in waiters:
            if _is_gone(conn, now, key):
                refused.append(key)
            elif not conn.execute(
                "SELECT 1 FROM leases WHERE id = ?1 UNION ALL SELECT 1 FROM waiters WHERE id = ?1",
                (key,),
            ).fetchone():
                seq = conn.execute(
                    "INSERT INTO waiters (id, owner, resources, ttl_s, enqueued_at, expires_at,"
                    " lane) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (key, self._owner, json.dumps(resources), ttl, now, now + ttl,
                     lane_of(resources)),
                ).lastrowid  # fmt: skip  (re-registered as interactive: the class is not kept)
                index.enqueued(conn, lane_of(resources), 0, seq or 0, now)
        self._reset_pending = False
        return refused

    def _counted(self) -> int:
        self.work += 1
        return 0  # go on

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _grant(self, conn: sqlite3.Connection, now: float) -> set[str]:
        """Reclaim expired entries, then the grant pass; returns the ids won by our owner."""
        _reclaim(conn, now)
        if conn.execute("SELECT 1 FROM waiters LIMIT 1").fetchone() is None:
            conn.execute("DELETE FROM woken")
            return set()
        if conn.execute(
            "SELECT 1 FROM meta WHERE key = 'quarantine' AND value > ?", (now,)
        ).fetchone():
            return set()  # just re-created: holders of the old file re-register first

        def turn_into_lease(key: str) -> None:
            conn.execute(
                "INSERT INTO leases (id, owner, resources, ttl_s, granted_at, expires_at)"
                " SELECT id, owner, resources, ttl_s, ?, ? + ttl_s FROM waiters WHERE id = ?",
                (now, now, key),
            )
            conn.execute("DELETE FROM waiters WHERE id = ?", (key,))

        granted = index.grant_pass(conn, now, index.Counts(conn), turn_into_lease)
        return {key for key, owner in granted if owner == self._owner}

    def _enqueue(
        self,
        conn: sqlite3.Connection,
        now: float,
        key: str,
        resources: tuple[str, ...],
        priority: tuple[int, float],
    ) -> StoreView:
        rank, ages_after_s = priority
        _reclaim(conn, now)
        if _is_gone(conn, now, key):  # a late enqueue of a withdrawn id (issue 22)
            return StoreView()
        lane = lane_of(resources)
        seq = conn.execute(
            "INSERT INTO waiters (id, owner, resources, ttl_s, enqueued_at, expires_at, lane,"
            " rank, ages_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key, self._owner, json.dumps(resources), self._ttl, now, now + self._ttl,
             lane, rank, now + ages_after_s),
        ).lastrowid  # fmt: skip
        index.enqueued(conn, lane, rank, seq or 0, now + ages_after_s)
        mine = self._grant(conn, now)
        if key in mine:
            return StoreView(granted=frozenset(mine))
        position = index.position(conn, key, now, index.Counts(conn), newcomer=True)
        return StoreView(
            granted=frozenset(mine), positions={key: position}, mean_hold_s=_mean_hold(conn)
        )

    def _withdraw(self, conn: sqlite3.Connection, now: float, key: str, keep: bool) -> Withdrawn:
        position = index.position(conn, key, now, index.Counts(conn))
        granted = False
        if position:
            index.removed(conn, key, now)
        else:
            row = conn.execute("SELECT resources FROM leases WHERE id = ?", (key,)).fetchone()
            if row is not None:
                granted = True
                if keep:
                    return Withdrawn(True, 0, StoreView())
                conn.execute("DELETE FROM leases WHERE id = ?", (key,))
                index.wake(conn, json.loads(row[0]))
        _bury(conn, now, [key], self._ttl)  # found or not: its enqueue may come late
        return Withdrawn(granted, position, StoreView(granted=frozenset(self._grant(conn, now))))

    def _release(
        self, conn: sqlite3.Connection, now: float, key: str, held_s: float
    ) -> StoreView:
        _bury(conn, now, [key], self._ttl)
        row = conn.execute("SELECT resources FROM leases WHERE id = ?", (key,)).fetchone()
        if row is not None:
            conn.execute("DELETE FROM leases WHERE id = ?", (key,))
            index.wake(conn, json.loads(row[0]))
            conn.execute(
                "INSERT INTO stats (key, value) VALUES ('mean_hold_s', 0.8 + 0.2 * ?1)"
                " ON CONFLICT (key) DO UPDATE SET value = 0.8 * value + 0.2 * ?1",
                (max(held_s, 0.0),),
            )
        else:
            _log.warning("lease %s was gone from the store (expired?) at release", key[:8])
        return StoreView(granted=frozenset(self._grant(conn, now)))

    def _poll(self, conn: sqlite3.Connection, waiting: list[str]) -> StoreView:
        now = time.time()
        (due,) = conn.execute(
            "SELECT MIN(e) FROM (SELECT MIN(expires_at) AS e FROM leases"
            " UNION ALL SELECT MIN(expires_at) FROM waiters)"
        ).fetchone()
        mine: set[str] = set()
        if now >= self._next_safety_pass or (due is not None and due < now):
            mine = _write(conn, self._grant)
            self._next_safety_pass = now + _SAFETY_PASS_S
        # Our own leases (no more than we hold and were just granted), not the ids we
        # wait for: a poll costs the same with 500 waiters as with 10.
        wanted = set(waiting)
        mine.update(r for (r,) in conn.execute("SELECT id FROM leases WHERE owner = ?",
                                               (self._owner,)) if r in wanted)
        if now < self._next_positions:
            return StoreView(granted=frozenset(mine))
        self._next_positions = now + _POSITIONS_EVERY_S
        # A few waiters' positions per round, in turn, each O(log n): not every waiter's.
        count = len(waiting)
        start = self._turn % count if count else 0
        told = [waiting[(start + i) % count] for i in range(min(count, _POSITIONS_PER_POLL))]
        self._turn = start + len(told)
        counts = index.Counts(conn)
        positions = {key: index.position(conn, key, now, counts) for key in told}
        return StoreView(
            granted=frozenset(mine),
            positions={key: p for key, p in positions.items() if p},
            limits=_limits(conn),
            mean_hold_s=_mean_hold(conn),
        )

    def _renew(self, conn: sqlite3.Connection, now: float, ids: list[str]) -> set[str]:
        wanted = json.dumps(ids)
        for table in ("leases", "waiters"):
            conn.execute(
                f"UPDATE {table} SET expires_at = ? + ttl_s WHERE id IN {_IDS}", (now, wanted)
            )
        found = conn.execute(
            f"SELECT id FROM leases WHERE id IN {_IDS} UNION ALL"
            f" SELECT id FROM waiters WHERE id IN {_IDS}",
            (wanted, wanted),
        )
        return set(ids) - {r for (r,) in found}

    def _drop(self, conn: sqlite3.Connection, now: float, ids: str) -> None:
        keys = json.loads(ids)
        _bury(conn, now, keys, self._ttl)
        for (resources,) in conn.execute(
            f"SELECT resources FROM leases WHERE id IN {_IDS}", (ids,)
        ).fetchall():
            index.wake(conn, json.loads(resources))
        conn.execute(f"DELETE FROM leases WHERE id IN {_IDS}", (ids,))
        for key in keys:
            index.removed(conn, key, now)
        self._grant(conn, now)

    def _set_limits(
        self, conn: sqlite3.Connection, now: float, rows: list[tuple[str, int]]
    ) -> StoreView:
        conn.executemany(
            "INSERT INTO limits (resource, lim) VALUES (?, ?)"
            " ON CONFLICT (resource) DO UPDATE SET lim = excluded.lim",
            rows,
        )
        index.wake_all(conn)
        mine = self._grant(conn, now)
        return StoreView(granted=frozenset(mine), limits=_limits(conn))

    def _snapshot(self, conn: sqlite3.Connection) -> AdmissionSnapshot:
        now = time.time()
        conn.execute("BEGIN")  # one consistent read
        try:
            held = _held(conn, now)
            queued: dict[str, int] = dict(
                conn.execute(
                    "SELECT j.value, COUNT(*) FROM waiters, json_each(waiters.resources) AS j"
                    " WHERE waiters.expires_at >= ? GROUP BY j.value",
                    (now,),
                )
            )
            waiting, batch = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(rank), 0) FROM waiters WHERE expires_at >= ?",
                (now,),
            ).fetchone()
            limits = _limits(conn)
        finally:
            conn.execute("COMMIT")
        return AdmissionSnapshot(
            held=held, queued=queued, limits=limits, waiting=waiting, store=self.name,
            batch_waiting=batch,
        )  # fmt: skip


def _write(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection, float], T]) -> T:
    """Run ``body`` in one ``BEGIN IMMEDIATE`` transaction (the fleet's critical section)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body(conn, time.time())
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def _use_wal(conn: sqlite3.Connection, within_s: float) -> None:
    """Switch to WAL (the mode persists in the file). The switch reads the file under
    a shared lock, then needs an exclusive one; when another process holds a write
    lock meanwhile, SQLite answers "database is locked" at once rather than call its
    busy handler (it would deadlock: sqlite3_busy_handler's documentation). Seen: 1
    start in 100 with four processes opening a new file together. So the switch is
    retried here, on the worker thread, for as long as the busy timeout."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(0.005)


def _identity(path: str) -> tuple[int, int] | None:
    """Which file ``path`` names now (None: none)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _settle(outcomes: list[tuple[_Job, bool, Any]]) -> None:
    for job, ok, value in outcomes:
        if job.future.cancelled():
            continue
        if ok:
            job.future.set_result(value)
        else:
            job.future.set_exception(value)


def _create_schema(conn: sqlite3.Connection, _now: float, path: str) -> None:
    check_sqlite_layout(conn, path)  # another release's file: refuse (StoreRefused)
    for statement in _SCHEMA:
        conn.execute(statement)
    # A file made before issue 18 lacks the waiters' lane and class: add them.
    columns = {row[1] for row in conn.execute("PRAGMA table_info(waiters)")}
    for column, kind in (("lane", "TEXT NOT NULL DEFAULT ''"),
                         ("rank", "INTEGER NOT NULL DEFAULT 0"),
                         ("ages_at", "REAL NOT NULL DEFAULT 0")):  # fmt: skip
        if column not in columns:
            conn.execute(f"ALTER TABLE waiters ADD COLUMN {column} {kind}")
    conn.execute("CREATE INDEX IF NOT EXISTS waiters_lane ON waiters(lane, rank, seq)")
    index.create(conn)


def _held(conn: sqlite3.Connection, now: float) -> dict[str, int]:
    return dict(
        conn.execute(
            "SELECT j.value, COUNT(*) FROM leases, json_each(leases.resources) AS j"
            " WHERE leases.expires_at >= ? GROUP BY j.value",
            (now,),
        )
    )


def _limits(conn: sqlite3.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT resource, lim FROM limits"))


def _mean_hold(conn: sqlite3.Connection) -> float:
    row = conn.execute("SELECT value FROM stats WHERE key = 'mean_hold_s'").fetchone()
    return 1.0 if row is None else float(row[0])


def _secret(conn: sqlite3.Connection, candidate: bytes) -> bytes:
    conn.execute("INSERT OR IGNORE INTO secret (id, key) VALUES (1, ?)", (candidate,))
    (key,) = conn.execute("SELECT key FROM secret WHERE id = 1").fetchone()
    return bytes(key)


# -- tombstones (issue 22): see "A late command cannot act" in the module doc -------------
def _bury(conn: sqlite3.Connection, now: float, ids: Iterable[str], ttl_s: float) -> None:
    """Refuse these ids for at least ``ttl_s`` (and the TTL they were registered with)."""
    conn.execute("DELETE FROM gone WHERE expires_at < ?", (now,))
    conn.executemany(
        "INSERT INTO gone (id, expires_at) VALUES (?1, ?2) ON CONFLICT (id)"
        " DO UPDATE SET expires_at = max(expires_at, excluded.expires_at)",
        [(key, now + ttl_s) for key in ids],
    )


def _reclaim(conn: sqlite3.Connection, now: float) -> None:
    """Delete the expired leases (waking what they held) and waiters, burying their ids."""
    for key, resources, ttl_s in conn.execute(
        "SELECT id, resources, ttl_s FROM leases WHERE expires_at < ?", (now,)
    ).fetchall():
        conn.execute("INSERT OR REPLACE INTO gone (id, expires_at) VALUES (?, ?)",
                     (key, now + ttl_s))  # fmt: skip
        conn.execute("DELETE FROM leases WHERE id = ?", (key,))
        index.wake(conn, json.loads(resources))
    for key, ttl_s in conn.execute(
        "SELECT id, ttl_s FROM waiters WHERE expires_at < ?", (now,)
    ).fetchall():
        conn.execute("INSERT OR REPLACE INTO gone (id, expires_at) VALUES (?, ?)",
                     (key, now + ttl_s))  # fmt: skip
        index.removed(conn, key, now)


def _is_gone(conn: sqlite3.Connection, now: float, key: str) -> bool:
    row = conn.execute("SELECT 1 FROM gone WHERE id = ? AND expires_at >= ?", (key, now))
    return row.fetchone() is not None
