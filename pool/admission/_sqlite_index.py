"""The grant rule kept as indexes in the SQLite file (issue 39), so that an enqueue, each
grant of a pass, a release, a withdraw or an expiry reads O(1) rows through O(log n)
index seeks, whatever the queue, the fleet or a consumer's backlog.

It is the memory store's design (:mod:`pool.admission._ready`) in tables::

    held(resource, n)               slots held: kept by triggers on ``leases``
    queued_n(resource, rank, n)     waiters per shared resource and class ("" = all):
                                    kept by triggers on ``waiters``
    waiter_res(resource, rank, seq) the waiters per shared resource and class ("" = all),
                                    for positions: kept by triggers on ``waiters``
    parked(cand, place, rank, seq, ages_at)
                                    every *candidate* (a lane, ``L<lane>|<class>``, or a
                                    waiter held back by its consumer, ``W<id>``) with its
                                    head's rank, under one full resource it needs
                                    (``place``), or under "" to be checked at the next pass
    woken(place)                    resources freed since the last pass

A pass reads the candidates under "" and under the woken resources that are not full,
best rank first, and checks one at a time: a full shared resource parks the lane
under it, a full consumer takes the waiter out of its lane (``waiters.held_back``)
and parks it under its consumer, otherwise the head is granted and its lane checked
again. Every resource a candidate is parked under stays full until a slot of it is
freed (a release, an expiry, a limit change), which wakes it: nobody else is read.

Positions (``position``): ``1 +`` the waiters ranked before that need a shared resource
blocking this one now, each counted up to ``_COUNT_CAP`` rows; beyond it, that resource's
whole queue (an upper bound). A newcomer's comes from the counters alone.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

from .._consumer import CONSUMER_PREFIX
from ._rule import UNLIMITED, is_private, lane_of

_COUNT_CAP = 1000  # rows a position counts per resource, at most
_NOT_PRIVATE = f"value NOT LIKE '{CONSUMER_PREFIX}%'"

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS held (resource TEXT PRIMARY KEY, n INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS queued_n (resource TEXT NOT NULL, rank INTEGER NOT NULL,
        n INTEGER NOT NULL, PRIMARY KEY (resource, rank)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS waiter_res (resource TEXT NOT NULL, rank INTEGER NOT NULL,
        seq INTEGER NOT NULL, PRIMARY KEY (resource, rank, seq)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS parked (cand TEXT PRIMARY KEY, place TEXT NOT NULL,
        rank INTEGER NOT NULL, seq INTEGER NOT NULL, ages_at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS parked_place ON parked(place, rank, seq)",
    "CREATE INDEX IF NOT EXISTS parked_aging ON parked(rank, ages_at)",
    "CREATE TABLE IF NOT EXISTS woken (place TEXT PRIMARY KEY) WITHOUT ROWID",
    """CREATE TRIGGER IF NOT EXISTS leases_held_in AFTER INSERT ON leases BEGIN
        INSERT INTO held (resource, n) SELECT value, 1 FROM json_each(NEW.resources) WHERE 1
        ON CONFLICT (resource) DO UPDATE SET n = n + 1; END""",
    """CREATE TRIGGER IF NOT EXISTS leases_held_out AFTER DELETE ON leases BEGIN
        UPDATE held SET n = n - 1 WHERE resource IN (SELECT value FROM json_each(OLD.resources));
        END""",
    f"""CREATE TRIGGER IF NOT EXISTS waiters_res_in AFTER INSERT ON waiters BEGIN
        INSERT INTO waiter_res (resource, rank, seq)
            SELECT value, NEW.rank, NEW.seq FROM json_each(NEW.resources) WHERE {_NOT_PRIVATE}
            UNION ALL SELECT '', NEW.rank, NEW.seq;
        INSERT INTO queued_n (resource, rank, n)
            SELECT value, NEW.rank, 1 FROM json_each(NEW.resources) WHERE {_NOT_PRIVATE}
            UNION ALL SELECT '', NEW.rank, 1 WHERE 1
            ON CONFLICT (resource, rank) DO UPDATE SET n = n + 1; END""",
    f"""CREATE TRIGGER IF NOT EXISTS waiters_res_out AFTER DELETE ON waiters BEGIN
        DELETE FROM waiter_res WHERE rank = OLD.rank AND seq = OLD.seq AND resource IN
            (SELECT value FROM json_each(OLD.resources) WHERE {_NOT_PRIVATE} UNION ALL SELECT '');
        UPDATE queued_n SET n = n - 1 WHERE rank = OLD.rank AND resource IN
            (SELECT value FROM json_each(OLD.resources) WHERE {_NOT_PRIVATE} UNION ALL SELECT '');
        END""",
)


def create(conn: sqlite3.Connection) -> None:
    """Create the index tables; fill them from the file when they are new (a file made
    before issue 39: every lane is checked at the next pass)."""
    new = not conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'parked'"
    ).fetchone()
    columns = {row[1] for row in conn.execute("PRAGMA table_info(waiters)")}
    if "held_back" not in columns:
        conn.execute("ALTER TABLE waiters ADD COLUMN held_back INTEGER NOT NULL DEFAULT 0")
    conn.execute("CREATE INDEX IF NOT EXISTS waiters_heads ON waiters(lane, rank, held_back, seq)")
    for statement in SCHEMA:
        conn.execute(statement)
    if not new:
        return
    conn.execute(
        "INSERT INTO held (resource, n) SELECT j.value, COUNT(*) FROM leases,"
        " json_each(leases.resources) AS j GROUP BY j.value"
    )
    conn.execute(
        "INSERT INTO waiter_res (resource, rank, seq) SELECT j.value, w.rank, w.seq"
        f" FROM waiters AS w, json_each(w.resources) AS j WHERE j.{_NOT_PRIVATE}"
        " UNION ALL SELECT '', rank, seq FROM waiters"
    )
    conn.execute(
        "INSERT INTO queued_n (resource, rank, n) SELECT resource, rank, COUNT(*)"
        " FROM waiter_res GROUP BY resource, rank"
    )
    conn.execute("UPDATE waiters SET held_back = 0")
    conn.execute(
        "INSERT INTO parked (cand, place, rank, seq, ages_at) SELECT 'L' || lane || '|' ||"
        " rank, '', rank, MIN(seq), MIN(ages_at) FROM waiters GROUP BY lane, rank"
    )


class Counts:
    """Held counts and limits, read one resource at a time and cached for a call."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._held: dict[str, int] = {}
        self._limits: dict[str, int] = {}

    def held(self, resource: str) -> int:
        found = self._held.get(resource)
        if found is None:
            row = self._conn.execute("SELECT n FROM held WHERE resource = ?", (resource,))
            found = self._held[resource] = max(0, (row.fetchone() or (0,))[0])
        return found

    def add(self, resources: tuple[str, ...]) -> None:
        for r in resources:
            self._held[r] = self.held(r) + 1

    def limit(self, resource: str) -> int:
        found = self._limits.get(resource)
        if found is None:
            prefix, sep, _ = resource.partition(":")
            row = self._conn.execute(
                "SELECT lim FROM limits WHERE resource IN (?1, ?2) ORDER BY resource = ?1 DESC"
                " LIMIT 1",
                (resource, prefix + sep if sep else resource),
            ).fetchone()
            found = self._limits[resource] = UNLIMITED if row is None else int(row[0])
        return found

    def full(self, resource: str) -> bool:
        return self.held(resource) >= self.limit(resource)


def lane_cand(lane: str, rank: int) -> str:
    return f"L{lane}|{rank}"


def park(
    conn: sqlite3.Connection, cand: str, place: str, order: tuple[int, int], ages_at: float
) -> None:
    conn.execute(
        "INSERT INTO parked (cand, place, rank, seq, ages_at) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (cand) DO UPDATE SET place = excluded.place, rank = excluded.rank,"
        " seq = excluded.seq, ages_at = excluded.ages_at",
        (cand, place, order[0], order[1], ages_at),
    )


def wake(conn: sqlite3.Connection, resources: tuple[str, ...] | list[str]) -> None:
    conn.executemany("INSERT OR IGNORE INTO woken (place) VALUES (?)", [(r,) for r in resources])


def wake_all(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT OR IGNORE INTO woken (place) SELECT DISTINCT place FROM parked")


_Head = tuple[str, str, tuple[str, ...], int, int, float]  # id, owner, resources, rank, seq, ages


def _head(conn: sqlite3.Connection, cand: str) -> _Head | None:
    if cand.startswith("W"):
        row = conn.execute(
            "SELECT id, owner, resources, rank, seq, ages_at FROM waiters WHERE id = ?",
            (cand[1:],),
        ).fetchone()
    else:
        lane, _, rank = cand[1:].rpartition("|")
        row = conn.execute(
            "SELECT id, owner, resources, rank, seq, ages_at FROM waiters WHERE lane = ?"
            " AND rank = ? AND held_back = 0 ORDER BY seq LIMIT 1",
            (lane, int(rank)),
        ).fetchone()
    if row is None:
        return None
    return row[0], row[1], tuple(json.loads(row[2])), row[3], row[4], row[5]


def _order(rank: int, seq: int, ages_at: float, now: float) -> tuple[int, int]:
    return (1 if rank and ages_at > now else 0), seq


def _first_full(resources: tuple[str, ...], counts: Counts, *, private: bool) -> str | None:
    found: str | None = None
    for r in resources:
        if is_private(r) == private and counts.full(r):
            if not r.startswith("backend:"):
                return r
            found = r
    return found


def grant_pass(
    conn: sqlite3.Connection,
    now: float,
    counts: Counts,
    turn_into_lease: Callable[[str], None],
) -> list[tuple[str, str]]:
    """One pass of the grant rule over the candidates that can be granted; returns the
    (id, owner) granted, each already turned into a lease by ``turn_into_lease``."""
    conn.execute("UPDATE parked SET rank = 0 WHERE rank = 1 AND ages_at <= ?", (now,))
    places = [""] + [p for (p,) in conn.execute("SELECT place FROM woken")]
    conn.execute("DELETE FROM woken")
    granted: list[tuple[str, str]] = []
    while True:
        best: tuple[int, int, str] | None = None
        for place in places:
            if place and counts.full(place):
                continue
            top = conn.execute(
                "SELECT rank, seq, cand FROM parked WHERE place = ? ORDER BY rank, seq LIMIT 1",
                (place,),
            ).fetchone()
            if top is not None and (best is None or tuple(top) < best):
                best = (top[0], top[1], top[2])
        if best is None:
            return granted
        cand = best[2]
        head = _head(conn, cand)
        if head is None:  # a lane emptied under us: nothing left to check
            conn.execute("DELETE FROM parked WHERE cand = ?", (cand,))
            continue
        key, owner, resources, rank, seq, ages_at = head
        order = _order(rank, seq, ages_at, now)
        blocked = _first_full(resources, counts, private=False)
        if blocked is not None:
            park(conn, cand, blocked, order, ages_at)
            continue
        consumer = _first_full(resources, counts, private=True)
        if consumer is not None:  # held back by its own consumer: out of its lane
            if cand.startswith("L"):
                conn.execute("UPDATE waiters SET held_back = 1 WHERE id = ?", (key,))
                _next_head(conn, cand, now)
            park(conn, "W" + key, consumer, order, ages_at)
            continue
        counts.add(resources)
        turn_into_lease(key)  # the waiter row becomes a lease
        granted.append((key, owner))
        if cand.startswith("W"):
            conn.execute("DELETE FROM parked WHERE cand = ?", (cand,))
        else:
            _next_head(conn, cand, now)


def _next_head(conn: sqlite3.Connection, cand: str, now: float, place: str = "") -> None:
    """The lane's head changed: re-rank it under ``place`` (or drop it: lane empty)."""
    head = _head(conn, cand)
    if head is None:
        conn.execute("DELETE FROM parked WHERE cand = ?", (cand,))
    else:
        park(conn, cand, place, _order(head[3], head[4], head[5], now), head[5])


def enqueued(conn: sqlite3.Connection, lane: str, rank: int, seq: int, ages_at: float) -> None:
    """A waiter row was inserted: a lane that had nobody is checked at the next pass."""
    cand = lane_cand(lane, rank)
    if not conn.execute("SELECT 1 FROM parked WHERE cand = ?", (cand,)).fetchone():
        park(conn, cand, "", (rank, seq), ages_at)


def removed(conn: sqlite3.Connection, key: str, now: float) -> bool:
    """Delete a waiter row (not granted: withdrawn, dropped, expired), keeping its lane's
    head right; False if there was none."""
    row = conn.execute(
        "SELECT lane, rank, seq, held_back FROM waiters WHERE id = ?", (key,)
    ).fetchone()
    if row is None:
        return False
    lane, rank, seq, held_back = row
    conn.execute("DELETE FROM waiters WHERE id = ?", (key,))
    if held_back:
        conn.execute("DELETE FROM parked WHERE cand = ?", ("W" + key,))
        return True
    cand = lane_cand(lane, rank)
    parked = conn.execute("SELECT place, seq FROM parked WHERE cand = ?", (cand,)).fetchone()
    if parked is not None and parked[1] == seq:  # it was the head
        _next_head(conn, cand, now, parked[0])
    return True


def position(
    conn: sqlite3.Connection, key: str, now: float, counts: Counts, *, newcomer: bool = False
) -> int:
    """A queued waiter's position (module doc); 0 if it does not wait."""
    row = conn.execute(
        "SELECT resources, rank, seq, ages_at FROM waiters WHERE id = ?", (key,)
    ).fetchone()
    if row is None:
        return 0
    resources, rank, seq, ages_at = tuple(json.loads(row[0])), row[1], row[2], row[3]
    blocking = [r for r in resources if not is_private(r) and counts.full(r)]
    if not blocking:
        return 1
    aged = rank == 0 or ages_at <= now

    def total(resource: str, of_rank: int) -> int:
        found = conn.execute(
            "SELECT n FROM queued_n WHERE resource = ? AND rank = ?", (resource, of_rank)
        ).fetchone()
        return 0 if found is None else int(found[0])

    def before(resource: str, of_rank: int) -> int:
        if newcomer:  # it is the last of its class: everybody of a class before it
            return total(resource, of_rank) - int(of_rank == rank)
        (found,) = conn.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM waiter_res WHERE resource = ? AND rank = ?"
            " AND seq < ? LIMIT ?)",
            (resource, of_rank, seq, _COUNT_CAP),
        ).fetchone()
        return int(found) if int(found) < _COUNT_CAP else total(resource, of_rank)

    def ahead(resource: str) -> int:
        return before(resource, 1) + (before(resource, 0) if aged else total(resource, 0))

    counted = sum(ahead(r) for r in blocking)
    # Blocked by several resources, a waiter ahead may be counted once per resource:
    # everybody ranked before bounds it too (one more count: only then).
    return 1 + (min(counted, ahead("")) if len(blocking) > 1 else counted)


def lane_key(resources: tuple[str, ...]) -> str:
    return lane_of(resources)
