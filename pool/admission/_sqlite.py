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
    owners(owner, expires_at, n)                  each process's liveness deadline, and
                                                  how many entries it has (triggers)
    inbox(seq AUTOINCREMENT, owner, id)           grants made by another process, read
                                                  by the owner's poll (deleted with the
                                                  lease)

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
  waiter whatever process that waiter belongs to, and writes the grant to the
  owner's ``inbox``; the owner discovers the lease on its next poll. Polls are
  read-only (the inbox after the last row seen, at most 256 rows; the positions of
  at most 32 of the process's waiters, each in turn) and cheap in WAL mode, where
  readers never block the writer; a poll upgrades to a write transaction only when
  some process's liveness deadline has passed (a crashed process) or once a second
  as a safety net.
* **Liveness per owner** (issue 39). A process renews ONE deadline, its own
  (``owners``), once per TTL/3 whatever it holds; its leases and waiters live as long
  as it does. An enqueue or a restore also renews it. The renewal answers how many
  entries the file holds for the process (``owners.n``, kept by triggers); only when
  that is fewer than the process holds does the process check its ids, 256 per
  read, and fence or fail the missing ones. Once an owner's deadline has passed, each
  write transaction (anybody's) drops up to 128 of its entries, with tombstones, then
  the owner itself. Restores and closes go 256 ids per transaction: no transaction
  runs over all of a process's ids. A row's own ``expires_at`` is kept (the layout's
  columns) but no longer read nor indexed (layout 4).
* **A dedicated thread, group commit.** sqlite3 calls block, so each coordinator owns
  one worker thread and one connection. Store calls are queued to it in order (a
  withdraw reaches the file after its enqueue); each round the thread commits every
  queued write call in one transaction, one savepoint per call, so concurrent callers
  share the thread hop and the commit.
* **Savepoint journals in memory** (``temp_store=MEMORY``). A savepoint keeps the
  original of every page its call changes; SQLite spills that journal to a temporary
  file once it passes 64 KiB, i.e. from the 16th page. With 10,000 waiters over 1,000
  Spaces an enqueue or a withdraw of layout 3 changed about 16 pages (one leaf of each
  table and index it touches, none shared with another), so most of them created,
  wrote and deleted a temporary file: the same statement steps as with one waiter,
  1.7× the time (issue 39). In memory the journal costs a copy of those pages, held
  until the call's savepoint is released: at most some 850 pages (3.4 MB) for the
  largest calls, a 256-id chunk of a close or a restore among 10,000 waiters.
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
  fenced) and its queued waiters, in order (256 per transaction), and sets a
  *quarantine* of one lease TTL in the file, during which nothing new is granted:
  every process that held slots in the old file renews within that time, notices
  and re-registers, or reaches its local expiry and fences itself. Left open: a
  process that never opened the old file, and is the first to reach the new one, is
  not held back by that quarantine.

Expiry uses the wall clock (``time.time()``): it is shared by every process of the
host, and unlike ``CLOCK_MONOTONIC`` it survives a reboot with the file on disk. A
wall-clock step forward expires leases early in the file while their holders'
(monotonic) local expiry has not passed: keep the host's clock slewed, not stepped.
Options: ``?busy_timeout_ms=2000&poll_ms=10``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
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
from ._rule import INTERACTIVE, RANK, UNLIMITED, lane_of
from ._sqlite_values import SCHEMA as VALUES_SCHEMA
from ._sqlite_values import SQLiteValues
from ._store_layout import check_sqlite_layout

T = TypeVar("T")
_log = logging.getLogger("spacepool.admission")

_SAFETY_PASS_S = 1.0  # a poll runs a full write pass at least this often
_BATCH = 64  # at most this many store calls share one transaction
_CHUNK = 256  # ids per transaction in a restore, a drop or a check (none runs over all)
_INBOX_PER_POLL = 256  # grants a poll reads from the inbox, at most
_REAP_BUDGET = 128  # entries of owners past their deadline dropped per write transaction
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
    """CREATE TABLE IF NOT EXISTS leases (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        resources TEXT NOT NULL,
        ttl_s REAL NOT NULL,
        granted_at REAL NOT NULL,
        expires_at REAL NOT NULL)""",
    "CREATE TABLE IF NOT EXISTS stats (key TEXT PRIMARY KEY, value REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS secret (id INTEGER PRIMARY KEY CHECK (id = 1), key BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value REAL NOT NULL)",
    # Tombstones (issue 22): ids that left the store, refused until expires_at.
    "CREATE TABLE IF NOT EXISTS gone (id TEXT PRIMARY KEY, expires_at REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS gone_expiry ON gone(expires_at)",
    *VALUES_SCHEMA,
)

# Liveness per owner (layout 3): the deadlines, the entries per owner, the inbox.
_OWNERS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS owners (owner TEXT PRIMARY KEY, expires_at REAL NOT NULL,
        n INTEGER NOT NULL DEFAULT 0)""",
    "CREATE INDEX IF NOT EXISTS owners_expiry ON owners(expires_at)",
    "CREATE INDEX IF NOT EXISTS leases_owner ON leases(owner)",
    "CREATE INDEX IF NOT EXISTS waiters_owner ON waiters(owner)",
    """CREATE TABLE IF NOT EXISTS inbox (seq INTEGER PRIMARY KEY AUTOINCREMENT,
        owner TEXT NOT NULL, id TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS inbox_owner ON inbox(owner, seq)",
    "CREATE INDEX IF NOT EXISTS inbox_id ON inbox(id)",
    """CREATE TRIGGER IF NOT EXISTS leases_owner_in AFTER INSERT ON leases BEGIN
        UPDATE owners SET n = n + 1 WHERE owner = NEW.owner; END""",
    """CREATE TRIGGER IF NOT EXISTS leases_owner_out AFTER DELETE ON leases BEGIN
        UPDATE owners SET n = n - 1 WHERE owner = OLD.owner;
        DELETE FROM inbox WHERE id = OLD.id; END""",
    """CREATE TRIGGER IF NOT EXISTS waiters_owner_in AFTER INSERT ON waiters BEGIN
        UPDATE owners SET n = n + 1 WHERE owner = NEW.owner; END""",
    """CREATE TRIGGER IF NOT EXISTS waiters_owner_out AFTER DELETE ON waiters BEGIN
        UPDATE owners SET n = n - 1 WHERE owner = OLD.owner; END""",
)
# Indexes of earlier layouts that no statement reads (layout 4 drops them): the rows'
# own deadlines (liveness is per owner), and the lanes (waiters_heads serves them).
_UNREAD_INDEXES = ("waiters_expiry", "leases_expiry", "waiters_lane")
_LIVE = "(o.expires_at IS NULL OR o.expires_at >= ?)"  # an entry whose owner is alive

_IDS = "(SELECT value FROM json_each(?))"  # a JSON array parameter as a set of ids
_Entry = tuple[bool, tuple[str, tuple[str, ...]]]  # (queued, (id, resources)) to restore


class SQLiteCoordinator(SharedCoordinator):
    """Admission shared by the processes of one host through one SQLite file."""

    def __init__(self, url: str, *, lease_ttl_s: float = 15.0, count_work: int = 0) -> None:
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
        """SQLite virtual-machine steps run so far, in units of ``count_work`` steps
        (0, the default: not counted; tests/admission/test_work.py)."""
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
    positions_per_poll = 32  # our waiters whose positions a poll refreshes, in turn...
    positions_every_s = 0.25  # ...this often at most

    def __init__(
        self,
        path: str,
        *,
        owner: str,
        lease_ttl_s: float,
        busy_timeout_s: float,
        poll_interval_s: float,
        count_work: int = 0,
    ) -> None:
        self.path = path
        self.work = 0
        self._count_work = count_work
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
        self._restore_lock = asyncio.Lock()
        # Worker-thread state:
        self._conn: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._reset_pending = False  # the file changed: only a restore may run
        self._generation = 0  # files opened after a reset (a restore must finish in one)
        self._inbox_after = 0  # the last inbox row our polls read
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
        """Re-register this process's limits, live leases and waiters in a new file,
        ``_CHUNK`` entries per transaction (the others wait until the last one)."""
        async with self._restore_lock:
            for _ in range(3):
                if await self._restore_once():
                    return
        raise StoreUnavailable(f"sqlite {self.path}: the file keeps being replaced")

    async def _restore_once(self) -> bool:
        """One pass over our entries; False if the file was replaced again meanwhile."""
        leases, waiters = self._local.local_entries() if self._local else ([], [])
        limits, secret, ttl = list(self._limits_set.items()), self._secret, self._ttl
        entries = [(False, e) for e in leases] + [(True, e) for e in waiters]
        chunks = [entries[i : i + _CHUNK] for i in range(0, len(entries), _CHUNK)] or [[]]
        refused: list[str] = []
        generation: list[int] = []  # set by the first chunk, checked by the others
        for number, chunk in enumerate(chunks):
            last = number == len(chunks) - 1

            def restore(
                conn: sqlite3.Connection, now: float, chunk: list[_Entry] = chunk,
                last: bool = last,
            ) -> list[str] | bool | None:  # fmt: skip
                return self._restore_in(conn, now, ttl, limits, secret, chunk, generation, last)

            out = await self._submit_once(restore, "write", restore=True)
            if out is None:  # no reset pending (another call restored already)
                return True
            if out is False:  # replaced again under the restore: start over
                return False
            assert isinstance(out, list)
            refused += out
        _log.warning(
            "sqlite admission store %s was replaced; re-registered %d lease(s) (%d "
            "refused: their slots were taken), %d waiter(s)",
            self.path, len(leases) - len(refused), len(refused), len(waiters),
        )  # fmt: skip
        if refused and self._local is not None:
            self._local.entries_lost(refused)
        return True

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

    async def poll(self, told: Sequence[str]) -> StoreView:
        ids = list(told)
        return await self._read(lambda conn: self._poll(conn, ids))

    async def renew(self, held: int, held_ids: Callable[[], Sequence[str]]) -> set[str]:
        """One renewal of our liveness, whatever we hold; our ids are checked (a chunk
        per read) only when the file holds fewer entries of ours than ``held``."""
        found = await self._transact(lambda c, now: self._renew(c, now))
        if found >= held:
            return set()
        ids = list(held_ids())
        missing: set[str] = set()
        for i in range(0, len(ids), _CHUNK):
            part = json.dumps(ids[i : i + _CHUNK])
            missing.update(await self._read(functools.partial(_missing, ids=part)))
        return missing

    async def drop(self, ids: Sequence[str]) -> None:
        keys = list(ids)
        for i in range(0, len(keys), _CHUNK):
            gone = json.dumps(keys[i : i + _CHUNK])
            await self._transact(functools.partial(self._drop, ids=gone))

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
            self._generation += 1
        if self._conn is None:
            os.makedirs(os.path.dirname(self.path) or "/", exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None)
            if self._count_work:
                conn.set_progress_handler(self._counted, self._count_work)
            try:
                _use_wal(conn, self._busy_timeout_s)
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA temp_store=MEMORY")  # savepoint journals: module doc
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
        chunk: list[_Entry],
        generation: list[int],
        last: bool,
    ) -> list[str] | bool | None:
        """Re-register one chunk of our entries after a reset (see the module doc): the
        ids refused; None if no reset is pending (at the first chunk); False if the file
        was replaced again since the first chunk. The last one lets the others run."""
        if not generation:
            if not self._reset_pending:
                return None
            generation.append(self._generation)
            self._inbox_after = 0  # a new file's inbox starts again
        elif generation[0] != self._generation:
            return False
        # Each chunk: quarantine (from its time), limits, secret, our liveness.
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('quarantine', ?) ON CONFLICT (key)"
            " DO UPDATE SET value = max(value, excluded.value)",
            (now + ttl,),
        )
        conn.executemany("INSERT OR IGNORE INTO limits (resource, lim) VALUES (?, ?)", limits)
        if secret is not None:
            _secret(conn, secret)
        _alive(conn, now, self._owner, ttl)
        counts = index.Counts(conn)
        refused: list[str] = []
        for queued, (key, resources) in chunk:
            if _is_gone(conn, now, key):
                refused.append(key)  # it left the store: never back (issue 22)
            elif not queued:
                if conn.execute("SELECT 1 FROM leases WHERE id = ?", (key,)).fetchone():
                    continue
                index.removed(conn, key, now)
                if any(counts.held(r) >= counts.limit(r) for r in resources):
                    refused.append(key)  # its slot was given away meanwhile
                    continue
                counts.add(resources)
                conn.execute(
                    "INSERT INTO leases (id, owner, resources, ttl_s, granted_at, expires_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (key, self._owner, json.dumps(resources), ttl, now, now + ttl),
                )
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
        if last:
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
            # Another process's waiter: its owner's next poll reads it there.
            conn.execute(
                "INSERT INTO inbox (owner, id) SELECT owner, id FROM waiters"
                " WHERE id = ? AND owner != ?",
                (key, self._owner),
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
        _alive(conn, now, self._owner, self._ttl)  # the entry lives as long as we do
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
        counts = index.Counts(conn)
        position = index.position(conn, key, now, counts, newcomer=True)
        return StoreView(
            granted=frozenset(mine),
            positions={key: position},
            limits=_limits_of(counts, resources),  # what its estimate needs, not the table
            mean_hold_s=_mean_hold(conn),
        )

    def _withdraw(self, conn: sqlite3.Connection, now: float, key: str, keep: bool) -> Withdrawn:
        # Only a timeout (keep) tells the position: a cancel does not count who is ahead.
        position = index.position(conn, key, now, index.Counts(conn)) if keep else 0
        granted = False
        if not index.removed(conn, key, now):
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

    def _poll(self, conn: sqlite3.Connection, told: list[str]) -> StoreView:
        """Our grants made by others (the inbox after the last row read, at most
        ``_INBOX_PER_POLL``) and the positions of ``told``: bounded reads, whatever we
        hold; a write pass when an owner's deadline has passed, or once a second."""
        now = time.time()
        (due,) = conn.execute("SELECT MIN(expires_at) FROM owners").fetchone()
        mine: set[str] = set()
        if now >= self._next_safety_pass or (due is not None and due < now):
            mine = _write(conn, self._grant)
            self._next_safety_pass = now + _SAFETY_PASS_S
        rows = conn.execute(
            "SELECT seq, id FROM inbox WHERE owner = ? AND seq > ? ORDER BY seq LIMIT ?",
            (self._owner, self._inbox_after, _INBOX_PER_POLL),
        ).fetchall()
        if rows:
            self._inbox_after = rows[-1][0]
            mine.update(key for _, key in rows)
        if not told:
            return StoreView(granted=frozenset(mine))
        counts = index.Counts(conn)
        positions: dict[str, int] = {}
        limits: dict[str, int] = {}
        for key in told:  # each O(log n): a few waiters per round, in turn
            position = index.position(conn, key, now, counts)
            row = conn.execute("SELECT resources FROM waiters WHERE id = ?", (key,)).fetchone()
            if position and row is not None:
                positions[key] = position
                limits.update(_limits_of(counts, json.loads(row[0])))
        return StoreView(
            granted=frozenset(mine),
            positions=positions,
            limits=limits,
            mean_hold_s=_mean_hold(conn),
        )

    def _renew(self, conn: sqlite3.Connection, now: float) -> int:
        """Push back our liveness; how many entries of ours the file holds."""
        _alive(conn, now, self._owner, self._ttl)
        row = conn.execute("SELECT n FROM owners WHERE owner = ?", (self._owner,)).fetchone()
        return 0 if row is None else int(row[0])

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
        # Nothing of ours left (the last chunk of a close): our liveness goes too.
        conn.execute("DELETE FROM owners WHERE owner = ? AND n <= 0", (self._owner,))
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
                    "SELECT j.value, COUNT(*) FROM waiters AS w LEFT JOIN owners AS o"
                    f" ON o.owner = w.owner JOIN json_each(w.resources) AS j WHERE {_LIVE}"
                    " GROUP BY j.value",
                    (now,),
                )
            )
            waiting, batch = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(w.rank), 0) FROM waiters AS w"
                f" LEFT JOIN owners AS o ON o.owner = w.owner WHERE {_LIVE}",
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
    # Layout 4: indexes no statement reads any more, each a page written per change.
    for unread in _UNREAD_INDEXES:
        conn.execute(f"DROP INDEX IF EXISTS {unread}")
    index.create(conn)
    new = not conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'owners'"
    ).fetchone()
    for statement in _OWNERS_SCHEMA:
        conn.execute(statement)
    if new:  # a file of an earlier layout: its entries' owners live until their rows' end
        conn.execute(
            "INSERT INTO owners (owner, expires_at, n) SELECT owner, MAX(e), COUNT(*) FROM"
            " (SELECT owner, expires_at AS e FROM leases UNION ALL"
            " SELECT owner, expires_at FROM waiters) GROUP BY owner"
        )


def _held(conn: sqlite3.Connection, now: float) -> dict[str, int]:
    """Slots held per resource by live owners (the snapshot: a whole-table read)."""
    return dict(
        conn.execute(
            "SELECT j.value, COUNT(*) FROM leases AS l LEFT JOIN owners AS o"
            f" ON o.owner = l.owner JOIN json_each(l.resources) AS j WHERE {_LIVE}"
            " GROUP BY j.value",
            (now,),
        )
    )


def _limits_of(counts: index.Counts, resources: Iterable[str]) -> dict[str, int]:
    """The limits of these resources (their own or their prefix's), the set ones only."""
    found = {r: counts.limit(r) for r in resources}
    return {r: n for r, n in found.items() if n != UNLIMITED}


def _alive(conn: sqlite3.Connection, now: float, owner: str, ttl_s: float) -> None:
    """Push back ``owner``'s liveness deadline (every entry of it lives as long)."""
    conn.execute(
        "INSERT INTO owners (owner, expires_at) VALUES (?, ?) ON CONFLICT (owner)"
        " DO UPDATE SET expires_at = max(expires_at, excluded.expires_at)",
        (owner, now + ttl_s),
    )


def _missing(conn: sqlite3.Connection, ids: str) -> set[str]:
    """Of these ids (a JSON array: one chunk), those neither a lease nor a waiter."""
    found = conn.execute(
        f"SELECT id FROM leases WHERE id IN {_IDS} UNION ALL"
        f" SELECT id FROM waiters WHERE id IN {_IDS}",
        (ids, ids),
    )
    return set(json.loads(ids)) - {r for (r,) in found}


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
    """Drop up to ``_REAP_BUDGET`` entries of owners whose deadline has passed (waking
    what their leases held, burying their ids), and the owners left with none."""
    budget = _REAP_BUDGET
    dead = conn.execute(
        "SELECT owner FROM owners WHERE expires_at < ? ORDER BY expires_at LIMIT 4", (now,)
    ).fetchall()
    for (owner,) in dead:
        for key, resources, ttl_s in conn.execute(
            "SELECT id, resources, ttl_s FROM leases WHERE owner = ? LIMIT ?", (owner, budget)
        ).fetchall():
            conn.execute("INSERT OR REPLACE INTO gone (id, expires_at) VALUES (?, ?)",
                         (key, now + ttl_s))  # fmt: skip
            conn.execute("DELETE FROM leases WHERE id = ?", (key,))
            index.wake(conn, json.loads(resources))
            budget -= 1
        for key, ttl_s in conn.execute(
            "SELECT id, ttl_s FROM waiters WHERE owner = ? LIMIT ?", (owner, budget)
        ).fetchall():
            conn.execute("INSERT OR REPLACE INTO gone (id, expires_at) VALUES (?, ?)",
                         (key, now + ttl_s))  # fmt: skip
            index.removed(conn, key, now)
            budget -= 1
        if budget <= 0:
            return  # the next write transaction goes on
        conn.execute("DELETE FROM owners WHERE owner = ?", (owner,))


def _is_gone(conn: sqlite3.Connection, now: float, key: str) -> bool:
    row = conn.execute("SELECT 1 FROM gone WHERE id = ? AND expires_at >= ?", (key, now))
    return row.fetchone() is not None
