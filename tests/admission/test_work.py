"""Work counted, not only timed (issue 39): the entries one admission operation touches
stay within a constant from 1 to 10,000 waiters and from 1 to 1,000 Spaces.

The memory store counts the entries of its grant index it touches
(``MemoryCoordinator.work``); the SQLite store counts the virtual-machine steps of its
statements (``SQLiteCoordinator.work``, SQLite's progress handler), and the lease
keeper of a shared store the entries its heartbeat and poller touch
(``keeper_work``). Each test builds the same scene small and large and compares one
operation's (or one cycle's) count.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from pool.admission import CONSUMER_PREFIX, Lease, WaitTicket
from pool.admission import _sqlite_index as index
from pool.admission._lease_keeper import _Waiter
from pool.admission._memory import MemoryCoordinator
from pool.admission._rule import lane_of
from pool.admission._sqlite import SQLiteCoordinator

from .helpers import GLOBAL, settle, until

SIZES = [(1, 1), (10_000, 1_000)]  # (waiters parked, Spaces)
SAME_STEPS = 20  # SQLite: an enqueue's or a cancel's steps, large against small, at most apart


@dataclass
class Scene:
    """Spaces all held (limit 1 each), waiters parked over them, a consumer's backlog."""

    coord: MemoryCoordinator | SQLiteCoordinator
    holders: dict[str, Lease] = field(default_factory=dict)
    parked: list[asyncio.Task[Lease]] = field(default_factory=list)


async def build(
    coord: MemoryCoordinator | SQLiteCoordinator,
    filler: MemoryCoordinator | SQLiteCoordinator,
    waiters: int,
    spaces: int,
    backlog: int,
) -> Scene:
    """``coord`` holds the Spaces and is measured; ``filler`` (another process's
    coordinator for SQLite: its polls are not counted) parks the waiters."""
    await coord.set_limits({GLOBAL: spaces + 100, "space:": 1, "space:backlog": 10,
                            CONSUMER_PREFIX: 1})  # fmt: skip
    scene = Scene(coord)
    for i in range(1 if isinstance(filler, SQLiteCoordinator) else spaces):  # see below
        scene.holders[f"space:s{i}"] = await coord.acquire([GLOBAL, f"space:s{i}"], timeout=0)
    await coord.acquire([GLOBAL, "space:backlog", CONSUMER_PREFIX + "x"], timeout=0)
    shapes = [
        (GLOBAL, f"space:s{i % spaces}") if i < waiters
        else (GLOBAL, "space:backlog", CONSUMER_PREFIX + "x")
        for i in range(waiters + backlog)
    ]  # fmt: skip
    if isinstance(filler, SQLiteCoordinator):
        await _park_in_file(filler, shapes, spaces)
        return scene
    tickets: list[WaitTicket] = []
    for resources in shapes:
        ticket = WaitTicket()
        tickets.append(ticket)
        scene.parked.append(asyncio.create_task(filler.acquire(resources, timeout=600,
                                                               ticket=ticket)))  # fmt: skip
    await until(lambda: all(t.position for t in tickets), timeout=60, what="all queued")
    return scene


async def _park_in_file(
    filler: SQLiteCoordinator, shapes: list[tuple[str, ...]], spaces: int
) -> None:
    """Another process's holders (every Space but the first) and waiters, written in one
    transaction of its store (the triggers keep the counts), then one grant pass parks
    them; nobody polls for them, and they outlive the test (TTL 600 s)."""
    store = filler._store

    def park_all(conn: sqlite3.Connection, now: float) -> None:
        conn.executemany(
            "INSERT INTO leases (id, owner, resources, ttl_s, granted_at, expires_at)"
            " VALUES (?, 'filler', ?, 600, ?, ?)",
            [(f"h{i}", json.dumps([GLOBAL, f"space:s{i}"]), now, now + 600)
             for i in range(1, spaces)],
        )  # fmt: skip
        conn.executemany(
            "INSERT INTO waiters (id, owner, resources, ttl_s, enqueued_at, expires_at, lane,"
            " rank, ages_at) VALUES (?, 'filler', ?, 600, ?, ?, ?, 0, ?)",
            [(f"w{n}", json.dumps(res), now, now + 600, lane_of(res), now + 600)
             for n, res in enumerate(shapes)],
        )  # fmt: skip
        for lane in {lane_of(res) for res in shapes}:
            (seq,) = conn.execute("SELECT MIN(seq) FROM waiters WHERE lane = ?", (lane,))
            index.enqueued(conn, lane, 0, seq[0], now + 600)
        store._grant(conn, now)

    await store._transact(park_all)


async def cost(
    coord: MemoryCoordinator | SQLiteCoordinator, operation: Callable[[], Awaitable[object]]
) -> int:
    before = coord.work
    await operation()
    return coord.work - before


async def measure(
    coord: MemoryCoordinator | SQLiteCoordinator,
    filler: MemoryCoordinator | SQLiteCoordinator,
    waiters: int,
    spaces: int,
    backlog: int,
) -> dict[str, int]:
    scene = await build(coord, filler, waiters, spaces, backlog)
    counts = {}
    try:

        async def cycle() -> None:
            await coord.release(await coord.acquire([GLOBAL, "space:free"], timeout=0))

        async def other_consumer() -> None:
            lease = await coord.acquire([GLOBAL, "space:backlog", CONSUMER_PREFIX + "y"],
                                        timeout=0)  # fmt: skip
            await coord.release(lease)

        async def hand_off() -> None:
            await coord.release(scene.holders["space:s0"])

        async def cancel() -> None:
            task = scene.parked[-1] if filler is not coord else scene.parked[len(scene.parked) // 2]
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        counts["cycle"] = await cost(coord, cycle)
        counts["other consumer"] = await cost(coord, other_consumer)
        counts["enqueue"] = await cost(coord, lambda: _enqueue(coord, scene))
        counts["cancel"] = await cost(coord, cancel)
        counts["hand-off"] = await cost(coord, hand_off)
        return counts
    finally:
        for task in scene.parked:
            task.cancel()
        await asyncio.gather(*scene.parked, return_exceptions=True)
        await coord.aclose()
        await filler.aclose()


async def _enqueue(coord: MemoryCoordinator | SQLiteCoordinator, scene: Scene) -> None:
    ticket = WaitTicket()
    scene.parked.append(
        asyncio.create_task(coord.acquire([GLOBAL, "space:s0"], timeout=600, ticket=ticket))
    )
    await until(lambda: ticket.position > 0, what="queued")
    await settle()


async def test_memory_operations_touch_the_same_entries_at_fleet_scale() -> None:
    """Memory store: each operation touches as many index entries with 10,000 waiters
    over 1,000 Spaces and a 10,000-call backlog as with 1 waiter on 1 Space."""
    one, many = MemoryCoordinator(), MemoryCoordinator()
    small = await measure(one, one, *SIZES[0], backlog=0)
    large = await measure(many, many, *SIZES[1], backlog=10_000)
    print(f"memory: 1 waiter/1 Space {small}; 10,000/1,000 and a backlog {large}")
    for name, count in small.items():
        assert large[name] <= count + 4, f"{name}: {count} entries grew to {large[name]}"


async def test_sqlite_operations_visit_the_same_rows_at_fleet_scale(tmp_path: Path) -> None:
    """SQLite store: each operation runs as many statement steps with 10,000 waiters over
    1,000 Spaces and a 10,000-call backlog as with 1 waiter on 1 Space; an enqueue and a
    cancel the same number, to a few steps."""

    def opened(name: str, count_work: int) -> SQLiteCoordinator:
        # No poll in the measured process (a minute apart): each count is its operation's.
        return SQLiteCoordinator(f"sqlite:///{tmp_path}/{name}.db?poll_ms=60000",
                                 lease_ttl_s=600, count_work=count_work)  # fmt: skip

    small = await measure(opened("small", 1), opened("small", 0), *SIZES[0], backlog=0)
    large = await measure(opened("large", 1), opened("large", 0), *SIZES[1],
                          backlog=10_000)  # fmt: skip
    print(f"sqlite: 1 waiter/1 Space {small}; 10,000/1,000 and a backlog {large}")
    for name, count in small.items():
        assert large[name] <= 1.5 * count + 1000, f"{name}: {count} steps grew to {large[name]}"
    for name in ("enqueue", "cancel"):  # steps counted one by one, no poll in between
        assert abs(large[name] - small[name]) <= SAME_STEPS, (name, small[name], large[name])


async def test_sqlite_savepoint_journals_stay_in_memory(tmp_path: Path) -> None:
    """SQLite store: a call's savepoint journal never spills to a temporary file (at 10,000
    waiters an enqueue or a cancel changes about 16 pages, past SQLite's 64 KiB spill
    threshold: a file created and deleted per call made them 1.7x slower, with the same
    statement steps)."""
    coord = SQLiteCoordinator(f"sqlite:///{tmp_path}/journal.db")
    try:
        store = coord._store
        mode = await store._read(lambda conn: conn.execute("PRAGMA temp_store").fetchone()[0])
        assert mode == 2  # MEMORY
    finally:
        await coord.aclose()


# -- the lease keeper's cycles (issue 39, item 6) -------------------------------------------
HELD = [(1, 1), (1, 63), (1_000, 9_000)]  # (leases, waiters) one process holds


async def _holding(coord: SQLiteCoordinator, leases: int, waiters: int) -> list[str]:
    """Give ``coord`` that many leases (one per Space, limit 1) and waiters queued behind
    them, written in one transaction of its own store under its owner, and known to its
    lease keeper as if each had been acquired; returns the waiters' ids."""
    store = coord._store
    holds = [(f"l{i}", (GLOBAL, f"space:s{i}")) for i in range(leases)]
    queued = [(f"w{n}", (GLOBAL, f"space:s{n % leases}")) for n in range(waiters)]

    def write(conn: sqlite3.Connection, now: float) -> None:
        conn.execute("INSERT INTO limits (resource, lim) VALUES ('space:', 1)")
        conn.execute("INSERT INTO owners (owner, expires_at) VALUES (?, ?)",
                     (store._owner, now + 600))  # fmt: skip
        conn.executemany(
            "INSERT INTO leases (id, owner, resources, ttl_s, granted_at, expires_at)"
            " VALUES (?, ?, ?, 600, ?, ?)",
            [(key, store._owner, json.dumps(res), now, now + 600) for key, res in holds],
        )
        conn.executemany(
            "INSERT INTO waiters (id, owner, resources, ttl_s, enqueued_at, expires_at, lane,"
            " rank, ages_at) VALUES (?, ?, ?, 600, ?, ?, ?, 0, ?)",
            [(key, store._owner, json.dumps(res), now, now + 600, lane_of(res), now + 600)
             for key, res in queued],
        )  # fmt: skip
        for lane in {lane_of(res) for _, res in queued}:
            (seq,) = conn.execute("SELECT MIN(seq) FROM waiters WHERE lane = ?", (lane,))
            index.enqueued(conn, lane, 0, seq[0], now + 600)
        store._grant(conn, now)  # parks every lane under its full Space

    await store._transact(write)
    for key, res in holds:
        coord._new_lease(key, _Waiter(res, WaitTicket()))
    for key, res in queued:
        waiter = coord._waiters[key] = _Waiter(res, WaitTicket())
        waiter.enqueued = True
        coord._enqueued += 1
        coord._add_turn(key)
    return [key for key, _ in queued]


async def _cycles(leases: int, waiters: int, path: Path) -> dict[str, tuple[int, int]]:
    """(lease-keeper entries, SQLite steps) of one heartbeat and one poll (positions
    due, with its once-a-second write pass), once the process holds that much."""
    coord = SQLiteCoordinator(f"sqlite:///{path}", lease_ttl_s=600, count_work=100)
    queued = await _holding(coord, leases, waiters)
    try:
        await coord._heartbeat(timeout=5)  # the first one covers the new leases, once
        counts = {}
        before = coord.keeper_work, coord.work
        await coord._heartbeat(timeout=5)
        counts["heartbeat"] = coord.keeper_work - before[0], coord.work - before[1]
        coord._next_positions = 0.0
        coord._store._next_safety_pass = 0.0
        before = coord.keeper_work, coord.work
        await coord._poll_once()
        counts["poll"] = coord.keeper_work - before[0], coord.work - before[1]
        # Every entry is still there: the renewal found the count it expected.
        assert coord._live_leases == leases and coord._enqueued == waiters
        return counts
    finally:
        for key in queued:  # nobody awaits them: leave quietly
            waiter = coord._take_waiter(key)
            if waiter is not None:
                waiter.future.cancel()
        await coord.aclose()


async def test_lease_keeper_cycles_cost_the_same_from_1_to_10_000_held_ids(
    tmp_path: Path,
) -> None:
    """SQLite store: one heartbeat (a renewal of the process's liveness) and one poll
    (its grants, 32 positions, a write pass) touch as many keeper entries and run as
    many statement steps with 1,000 leases and 9,000 waiters as with 1 lease and 1
    waiter (the poll: as with 63 waiters, enough for a full round of positions)."""
    one, round_, many = [await _cycles(*held, tmp_path / f"{n}.db")
                         for n, held in enumerate(HELD)]  # fmt: skip
    print(f"lease keeper (entries, steps): 2 ids {one}; 64 ids {round_}; 10,000 ids {many}")
    for part in range(2):
        assert many["heartbeat"][part] <= one["heartbeat"][part] + 2, many["heartbeat"]
        small = round_["poll"][part]
        assert many["poll"][part] <= 1.5 * small + 10, f"poll: {small} grew to {many['poll']}"
