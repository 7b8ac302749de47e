"""Random arrivals (interactive and batch), releases, cancellations, timeouts, limit
changes and lease expiry, checked after every step.

Each store runs the same random scenario as a small pure reference model of the
grant rule (pool/admission/_rule.py); after every step the store must have granted
exactly what the model granted, and the observed state must satisfy the rule's
properties directly:

1. safety — no resource has more holders than its limit;
2. all-or-nothing — the store's holder counts are exactly those of the whole leases;
3/5/(a). work conservation, no monopoly — a waiter left waiting is short of a slot of
   a shared resource *now*: nobody holds a place on a resource that does not block
   it (a waiter of another Space, or one held back by its own consumer limit, never
   keeps a free slot idle);
4/(b). FIFO per resource, in rank order — replaying a step's grants in rank order
   (interactive first, then arrival), a waiter left waiting was short of a shared
   resource at its turn: no waiter ranked after it was served a resource it waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sqlite3
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pool import BusyError
from pool.admission import CONSUMER_PREFIX, Coordinator, Lease, WaitTicket, open_coordinator

from .conftest import REDIS_URL, STORES, drop_prefix, require_redis
from .helpers import GLOBAL, settle, until

LIMITS = {GLOBAL: 2, "space:a": 1, "space:b": 2, CONSUMER_PREFIX: 1}
ARRIVE, RELEASE, CANCEL, LIMIT, EXPIRE = "arrive", "release", "cancel", "limit", "expire"
Resources = tuple[str, ...]
Arrival = tuple[Resources, bool, str]  # resources, gives up at once, priority


def limit_of(resource: str, limits: dict[str, int] = LIMITS) -> int:
    if resource in limits:
        return limits[resource]
    return limits.get(resource.partition(":")[0] + ":", 1 << 30)


def private(resource: str) -> bool:
    return resource.startswith(CONSUMER_PREFIX)


def short_of(resources: Resources, counts: Counter[str], limits: dict[str, int]) -> set[str]:
    return {r for r in resources if not private(r) and counts[r] >= limit_of(r, limits)}


def consumer_blocked(resources: Resources, counts: Counter[str]) -> bool:
    return any(private(r) and counts[r] >= limit_of(r) for r in resources)


@dataclass
class Model:
    """The reference: the waiters in arrival order, their class, the holders, the rule."""

    held: dict[int, Resources] = field(default_factory=dict)
    queue: dict[int, Resources] = field(default_factory=dict)  # insertion = arrival order
    batch: set[int] = field(default_factory=set)
    limits: dict[str, int] = field(default_factory=lambda: dict(LIMITS))

    def counts(self) -> Counter[str]:
        return Counter(r for res in self.held.values() for r in res)

    def ranked(self, ids: list[int]) -> list[int]:
        """Interactive first, then arrival (nobody ages within a test's 60 s)."""
        return sorted(ids, key=lambda rid: (rid in self.batch, rid))

    def grant(self) -> set[int]:
        """One pass in rank order: grant whoever fits; a waiter short of a slot takes
        nothing (a full resource stays full for the rest of the pass)."""
        counts, granted = self.counts(), set[int]()
        for rid in self.ranked(list(self.queue)):
            res = self.queue[rid]
            if consumer_blocked(res, counts) or short_of(res, counts, self.limits):
                continue
            counts.update(res)
            self.held[rid] = self.queue.pop(rid)
            granted.add(rid)
        return granted


@st.composite
def requests(draw: st.DrawFn) -> Arrival:
    space = draw(st.sampled_from(["space:a", "space:b"]))
    consumer = draw(st.sampled_from([None, None, "u1", "u2"]))
    # One in five skips the global resource: the stores' grant pass stops early once
    # backend:global is full only while every waiter needs it, so mix both kinds.
    with_global = draw(st.integers(0, 4)) != 0
    resources = ((GLOBAL,) if with_global else ()) + (space,)
    resources += (CONSUMER_PREFIX + consumer,) if consumer else ()
    at_once = draw(st.integers(0, 3)) == 0  # a quarter give up at once (timeout 0)
    priority = draw(st.sampled_from(["interactive", "interactive", "batch"]))
    return resources, at_once, priority


# Arrivals outnumber departures, so queues form and grants compete.
steps = st.lists(
    st.one_of(
        st.tuples(st.just(ARRIVE), requests()),
        st.tuples(st.just(ARRIVE), requests()),
        st.tuples(st.just(ARRIVE), requests()),
        st.tuples(st.just(RELEASE), st.integers(0, 7)),
        st.tuples(st.just(CANCEL), st.integers(0, 7)),
        st.tuples(st.just(LIMIT), st.integers(1, 3)),  # backend:global's limit
        st.tuples(st.just(EXPIRE), st.integers(0, 7)),  # a lease's holder vanishes
    ),
    min_size=10,
    max_size=40,
)


async def run(url: str, scenario: list[tuple[str, object]]) -> None:
    """Play ``scenario`` on a fresh coordinator and on the model, checking every step."""
    coord = open_coordinator(url, lease_ttl_s=30)
    model = Model()
    tasks: dict[int, asyncio.Task[Lease]] = {}  # waiting requests, in arrival order
    leases: dict[int, Lease] = {}
    try:
        await coord.set_limits(dict(LIMITS))
        for number, (kind, arg) in enumerate(scenario):
            # 1. the model's side of the step, up to (not including) the grant pass
            rid = -1
            if kind == ARRIVE:
                assert isinstance(arg, tuple)
                resources, at_once, priority = arg
                model.queue[number] = resources
                if priority == "batch":
                    model.batch.add(number)
            elif kind in (RELEASE, EXPIRE) and leases:
                assert isinstance(arg, int)
                rid = sorted(leases)[arg % len(leases)]
                del model.held[rid]
            elif kind == CANCEL and model.queue:
                assert isinstance(arg, int)
                rid = list(model.queue)[arg % len(model.queue)]
                del model.queue[rid]
            elif kind == LIMIT:
                assert isinstance(arg, int)
                model.limits[GLOBAL] = arg
            else:
                continue
            before, waiting_before = model.counts(), list(model.queue)
            granted = model.grant()
            # 2. the same step on the store
            if kind == ARRIVE:
                tasks[number] = await arrive(coord, resources, at_once, priority)
                if at_once and number not in granted:
                    del model.queue[number]  # queued, then timed out at once
                    with pytest.raises(BusyError):
                        await tasks.pop(number)
            elif kind == RELEASE:
                await coord.release(leases.pop(rid))
            elif kind == EXPIRE:
                await expire(coord, url, leases.pop(rid))
            elif kind == LIMIT:
                await coord.set_limits({GLOBAL: model.limits[GLOBAL]})
            else:
                tasks[rid].cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await tasks.pop(rid)
            # 3. every grant made has reached its task; compare and check
            await until(
                lambda: all(tasks[r].done() for r in granted),  # noqa: B023
                timeout=2,
                what="the grants the model made",
            )
            await settle()
            for rid in [r for r, task in tasks.items() if task.done()]:
                leases[rid] = tasks.pop(rid).result()
            await check(coord, model, leases, tasks, granted, before, waiting_before)
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        await coord.aclose()


async def expire(coord: Coordinator, url: str, lease: Lease) -> None:
    """The lease's deadline passes in the store (its holder stopped renewing), then any
    store operation reclaims it: here a ``set_limits`` that changes nothing. The
    memory store has no expiry: its holder releases."""
    if url.startswith("memory:"):
        await coord.release(lease)
        return
    if url.startswith("sqlite:"):
        # Liveness is per owner: the lease moves to an owner whose deadline has passed
        # (deleted and inserted again, so that the triggers keep the counts).
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite://").split("?")[0])) as db:
            db.execute("INSERT OR REPLACE INTO owners (owner, expires_at) VALUES ('vanished', 0)")
            row = db.execute("SELECT * FROM leases WHERE id = ?", (lease.lease_id,)).fetchone()
            db.execute("DELETE FROM leases WHERE id = ?", (lease.lease_id,))
            db.execute("INSERT INTO leases VALUES (?, 'vanished', ?, ?, ?, ?)",
                       (row[0], *row[2:]))  # fmt: skip
            db.commit()
    else:
        # Liveness is per owner: the lease moves to an owner whose deadline has passed.
        prefix = url.partition("prefix=")[2].partition("&")[0]
        with redis.Redis.from_url(REDIS_URL) as r:
            record = json.loads(r.hget(prefix + "leases", lease.lease_id) or "{}")
            r.zrem(prefix + "owned", f"{record['o']}\x01{lease.lease_id}")
            record["o"] = "vanished"
            r.hset(prefix + "leases", lease.lease_id, json.dumps(record))
            r.zadd(prefix + "owned", {f"vanished\x01{lease.lease_id}": 0})
            r.zadd(prefix + "owners", {"vanished": 0})
    await coord.set_limits({})


async def arrive(
    coord: Coordinator, resources: Resources, at_once: bool, priority: str
) -> asyncio.Task[Lease]:
    """Start an acquire; return once the store has queued or granted it."""
    ticket = WaitTicket(priority=priority)
    task = asyncio.create_task(
        coord.acquire(resources, timeout=0 if at_once else 60, ticket=ticket)
    )
    await until(lambda: task.done() or ticket.position > 0, what="the arrival")
    return task


async def check(
    coord: Coordinator,
    model: Model,
    leases: dict[int, Lease],
    tasks: dict[int, asyncio.Task[Lease]],
    granted: set[int],
    before: Counter[str],
    waiting_before: list[int],
) -> None:
    """The store agrees with the model, and properties 1–5 hold for what it did."""
    assert set(leases) == set(model.held), "store and model granted different requests"
    assert list(tasks) == list(model.queue), "store and model disagree on who waits"
    counts = Counter(r for lease in leases.values() for r in lease.resources)
    # 1: a grant never takes a resource past its limit (a lowered limit leaves the
    # holders granted before it in place, so only resources granted now are checked)
    now_granted = {r for rid in granted for r in model.held.get(rid, ())}
    assert all(counts[r] <= limit_of(r, model.limits) for r in now_granted), "1: over a limit"
    snap = await coord.snapshot()
    assert snap.held == dict(+counts), "2: store holders differ from whole leases"
    waiting = [(rid, model.queue[rid]) for rid in tasks]
    for rid, res in waiting:
        if not consumer_blocked(res, counts):
            assert short_of(res, Counter(counts), model.limits), (
                f"3/5/(a): waiter {rid} has a free slot on every resource, yet waits"
            )
    # 4/(b): replay this step's grants in rank order from the counts before them: a
    # waiter left waiting must not have fitted at its turn (nobody overtook it).
    replay = Counter(before)
    for rid in model.ranked(sorted(set(waiting_before) | granted)):
        if rid in model.held:
            res = model.held[rid]
        elif rid in model.queue:
            res = model.queue[rid]
        else:
            continue  # timed out in this step
        if rid in granted:
            replay.update(res)
        elif not consumer_blocked(res, replay):
            assert short_of(res, replay, model.limits), (
                f"4/(b): waiter {rid} fitted at its turn but one ranked later was served"
            )


@pytest.mark.parametrize("kind", STORES)
def test_random_schedules_keep_properties_1_to_5(kind: str, tmp_path: Path) -> None:
    """Random schedules: every store matches the reference model and properties 1–5."""
    if kind == "redis":
        require_redis()

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(scenario=steps)
    def scenario_holds(scenario: list[tuple[str, object]]) -> None:
        name = uuid.uuid4().hex[:12]
        if kind == "memory":
            asyncio.run(run("memory://", scenario))
        elif kind == "sqlite":
            asyncio.run(run(f"sqlite:///{tmp_path}/{name}.db", scenario))
        else:
            prefix = f"spacepool-test:{name}:"
            try:
                asyncio.run(run(f"{REDIS_URL}?prefix={prefix}", scenario))
            finally:
                drop_prefix(prefix)

    scenario_holds()


# -- the memory store's grant index against the model, at fleet sizes (issue 39) ----------
@dataclass
class FleetModel:
    """The rule over plain lists: every waiter in rank order at each pass."""

    limits: dict[str, int]
    queue: dict[str, tuple[Resources, int, bool, float]] = field(default_factory=dict)
    held: Counter[str] = field(default_factory=Counter)

    def limit(self, resource: str) -> int:
        return limit_of(resource, self.limits)

    def grant(self, now: float) -> list[str]:
        ranked = sorted(
            self.queue,
            key=lambda k: (int(self.queue[k][2] and self.queue[k][3] > now), self.queue[k][1]),
        )
        granted = []
        for key in ranked:
            res = self.queue[key][0]
            if any(self.held[r] >= self.limit(r) for r in res):
                continue
            self.held.update(res)
            granted.append(key)
            del self.queue[key]
        return granted

    def ahead(self, key: str, now: float) -> int:
        """The waiters actually ahead (docs/scheduling.md's exact definition)."""
        res, seq, batch, ages_at = self.queue[key]

        def blocked(r: Resources) -> set[str]:
            return {x for x in r if not private(x) and self.held[x] >= self.limit(x)}

        def order(s: int, b: bool, a: float) -> tuple[int, int]:
            return int(b and a > now), s

        mine, me = blocked(res), order(seq, batch, ages_at)
        return sum(1 for other, (r, s, b, a) in self.queue.items()
                   if other != key and order(s, b, a) < me and blocked(r)
                   and blocked(r) <= mine)  # fmt: skip


def _random_waiter(rnd: random.Random, names: list[str]) -> tuple[Resources, bool]:
    """A random waiter's resources (global in 80 %, a consumer in half) and whether it
    is batch (30 %)."""
    res: Resources = ((GLOBAL,) if rnd.random() < 0.8 else ()) + (rnd.choice(names),)
    if rnd.random() < 0.5:
        res += (CONSUMER_PREFIX + rnd.choice("abc"),)
    return res, rnd.random() < 0.3


def play_fleet(seed: int, waiters: int, spaces: int) -> None:
    """Random arrivals, releases, cancels, limit changes and aging on a GrantIndex; after
    each step its grants equal the model's and each position bounds who is ahead."""
    from pool.admission._ready import GrantIndex
    from pool.admission._rule import limit_lookup

    rnd = random.Random(seed)
    names = [f"space:s{i}" for i in range(spaces)]
    limits = {GLOBAL: max(1, spaces // 2) + rnd.randint(0, 3), CONSUMER_PREFIX: 2,
              **{n: rnd.randint(1, 3) for n in names}}  # fmt: skip
    model, index = FleetModel(dict(limits)), GrantIndex()
    held: dict[str, int] = {}
    leases: dict[str, Resources] = {}
    now, seq, ages_after = 0.0, 0, rnd.choice([0.5, 3.0, 1e9])
    for _ in range(int(waiters * 2.5)):
        op = rnd.random()
        if op < 0.5 or not (leases or model.queue):
            if len(model.queue) >= waiters:
                continue
            seq += 1
            res, batch = _random_waiter(rnd, names)
            model.queue[str(seq)] = (res, seq, batch, now + ages_after)
            index.add(str(seq), res, seq, batch=batch, ages_at=now + ages_after, now=now)
        elif op < 0.72 and leases:
            key = rnd.choice(sorted(leases))
            res = leases.pop(key)
            model.held.subtract(res)
            for r in res:
                held[r] -= 1
            index.freed(res)
        elif op < 0.9 and model.queue:
            key = rnd.choice(list(model.queue))
            del model.queue[key]
            index.remove(key, now)
        elif op < 0.95:
            name = rnd.choice([GLOBAL, *names])
            model.limits[name] = limits[name] = rnd.randint(1, 4)
            index.wake_all()
        else:
            now += rnd.choice([0.1, 1.0, 5.0])
        expected = model.grant(now)
        granted = index.grant_pass(held, limit_lookup(limits), now)
        assert [w.key for w in granted] == expected, "index and model granted differently"
        leases.update((w.key, w.resources) for w in granted)
        assert {r: n for r, n in held.items() if n} == dict(+model.held)
        if model.queue and rnd.random() < 0.2:
            key = rnd.choice(list(model.queue))
            position, _ = index.position(key, held, limit_lookup(limits), now)
            assert position >= 1 + model.ahead(key, now), "a position below who is ahead"


@pytest.mark.parametrize(
    ("waiters", "spaces", "examples"), [(30, 3, 40), (200, 20, 6), (1000, 100, 2)]
)
def test_grant_index_matches_the_model_at_fleet_sizes(
    waiters: int, spaces: int, examples: int
) -> None:
    """Random operation sequences up to 1,000 waiters over 100 Spaces: the memory store's
    grant index grants exactly what the model grants, and positions are upper bounds."""

    @settings(max_examples=examples, deadline=None, database=None)
    @given(seed=st.integers(0, 2**32 - 1))
    def holds(seed: int) -> None:
        play_fleet(seed, waiters, spaces)

    holds()


def play_fleet_sqlite(seed: int, waiters: int, spaces: int, path: str) -> None:
    """The same random sequences on the SQLite store's calls, in its transactions: its
    grants equal the model's after each step and each position bounds who is ahead."""
    from pool.admission import _sqlite_index as index
    from pool.admission._sqlite import _SQLiteStore

    rnd = random.Random(seed)
    names = [f"space:s{i}" for i in range(spaces)]
    limits = {GLOBAL: max(1, spaces // 2) + rnd.randint(0, 3), CONSUMER_PREFIX: 2,
              **{n: rnd.randint(1, 3) for n in names}}  # fmt: skip
    model = FleetModel(dict(limits))
    store = _SQLiteStore(path, owner="o", lease_ttl_s=3600, busy_timeout_s=2,
                         poll_interval_s=1)  # fmt: skip
    conn = store._connection()
    leases: dict[str, Resources] = {}
    now, seq, ages_after = 1e6, 0, rnd.choice([0.5, 3.0, 1e5])
    conn.execute("BEGIN IMMEDIATE")
    store._set_limits(conn, now, list(limits.items()))
    try:
        for _ in range(int(waiters * 2.5)):
            op = rnd.random()
            if op < 0.5 or not (leases or model.queue):
                if len(model.queue) >= waiters:
                    continue
                seq += 1
                res, batch = _random_waiter(rnd, names)
                model.queue[str(seq)] = (res, seq, batch, now + ages_after)
                got = store._enqueue(conn, now, str(seq), res, (int(batch), ages_after)).granted
            elif op < 0.72 and leases:
                key = rnd.choice(sorted(leases))
                model.held.subtract(leases.pop(key))
                got = store._release(conn, now, key, 0.0).granted
            elif op < 0.9 and model.queue:
                key = rnd.choice(list(model.queue))
                del model.queue[key]
                got = store._withdraw(conn, now, key, keep=False).view.granted
            elif op < 0.95:
                name = rnd.choice([GLOBAL, *names])
                model.limits[name] = rnd.randint(1, 4)
                got = store._set_limits(conn, now, [(name, model.limits[name])]).granted
            else:
                now += rnd.choice([0.1, 1.0, 5.0])
                got = frozenset(store._grant(conn, now))
            queued = dict(model.queue)
            expected = model.grant(now)
            assert set(got) == set(expected), "the SQLite store and the model granted differently"
            leases.update((key, queued[key][0]) for key in expected)
            if model.queue and rnd.random() < 0.2:
                key = rnd.choice(list(model.queue))
                position = index.position(conn, key, now, index.Counts(conn))
                assert position >= 1 + model.ahead(key, now), "a position below who is ahead"
    finally:
        conn.execute("ROLLBACK")
        store._close()


@pytest.mark.parametrize(
    ("waiters", "spaces", "examples"), [(30, 3, 15), (200, 20, 3), (1000, 100, 1)]
)
def test_sqlite_grant_index_matches_the_model_at_fleet_sizes(
    waiters: int, spaces: int, examples: int, tmp_path: Path
) -> None:
    """Random operation sequences up to 1,000 waiters over 100 Spaces on the SQLite
    store's grant index (its calls, in one transaction): the model's grants, and
    positions that are upper bounds."""

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
    @given(seed=st.integers(0, 2**32 - 1))
    def holds(seed: int) -> None:
        play_fleet_sqlite(seed, waiters, spaces, str(tmp_path / f"{seed}.db"))

    holds()
