"""Random arrivals, releases, cancellations and timeouts, checked after every step.

Each store runs the same random scenario as a small pure reference model of the
grant rule; after every step the store must have granted exactly what the model
granted, and the observed state must satisfy SPEC 4.5 properties 1–5 directly:

1. safety — no resource has more holders than its limit;
2. all-or-nothing — the store's holder counts are exactly those of the whole leases;
3. no monopoly and 5. work conservation — a waiter that would fit is only ever held
   back by the places earlier waiters hold in line on its shared resources (a
   waiter blocked by its own consumer limit holds no place);
4. FIFO — replaying a step's grants in arrival order, every waiter left waiting was
   short of a slot at its turn, counting the places of the waiters before it: no
   later waiter was served in its place.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pool import BusyError
from pool.admission import CONSUMER_PREFIX, Coordinator, Lease, WaitTicket, open_coordinator

from .conftest import REDIS_URL, STORES, drop_prefix, require_redis
from .helpers import GLOBAL, settle, until

LIMITS = {GLOBAL: 2, "space:a": 1, "space:b": 2, CONSUMER_PREFIX: 1}
ARRIVE, RELEASE, CANCEL = "arrive", "release", "cancel"
Resources = tuple[str, ...]


def limit_of(resource: str) -> int:
    if resource in LIMITS:
        return LIMITS[resource]
    return LIMITS.get(resource.partition(":")[0] + ":", 1 << 30)


def private(resource: str) -> bool:
    return resource.startswith(CONSUMER_PREFIX)


def short_of(resources: Resources, counts: Counter[str]) -> set[str]:
    return {r for r in resources if not private(r) and counts[r] >= limit_of(r)}


def consumer_blocked(resources: Resources, counts: Counter[str]) -> bool:
    return any(private(r) and counts[r] >= limit_of(r) for r in resources)


@dataclass
class Model:
    """The reference: a queue in arrival order, the holders, and the rule of _rule.py."""

    held: dict[int, Resources] = field(default_factory=dict)
    queue: dict[int, Resources] = field(default_factory=dict)  # insertion = arrival order

    def counts(self) -> Counter[str]:
        return Counter(r for res in self.held.values() for r in res)

    def grant(self) -> set[int]:
        """The rule's pass, repeated until it grants nothing new (a place held by a
        waiter whose consumer a later grant filled is given up on the next pass)."""
        granted = set[int]()
        while True:
            counts, new = self.counts(), set[int]()
            for rid, res in list(self.queue.items()):
                if consumer_blocked(res, counts):
                    continue
                if short_of(res, counts):
                    counts.update(r for r in res if not private(r))  # holds its place
                    continue
                counts.update(res)
                self.held[rid] = self.queue.pop(rid)
                new.add(rid)
            if not new:
                return granted
            granted |= new


@st.composite
def requests(draw: st.DrawFn) -> tuple[Resources, bool]:
    space = draw(st.sampled_from(["space:a", "space:b"]))
    consumer = draw(st.sampled_from([None, None, "u1", "u2"]))
    # One in five skips the global resource: the stores' grant pass stops early once
    # backend:global is full only while every waiter needs it, so mix both kinds.
    with_global = draw(st.integers(0, 4)) != 0
    resources = ((GLOBAL,) if with_global else ()) + (space,)
    resources += (CONSUMER_PREFIX + consumer,) if consumer else ()
    at_once = draw(st.integers(0, 3)) == 0  # a quarter give up at once (timeout 0)
    return resources, at_once


# Arrivals outnumber departures, so queues form and grants compete.
steps = st.lists(
    st.one_of(
        st.tuples(st.just(ARRIVE), requests()),
        st.tuples(st.just(ARRIVE), requests()),
        st.tuples(st.just(ARRIVE), requests()),
        st.tuples(st.just(RELEASE), st.integers(0, 7)),
        st.tuples(st.just(CANCEL), st.integers(0, 7)),
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
            if kind == ARRIVE:
                assert isinstance(arg, tuple)
                resources, at_once = arg
                model.queue[number] = resources
            elif kind == RELEASE and leases:
                assert isinstance(arg, int)
                rid = sorted(leases)[arg % len(leases)]
                del model.held[rid]
            elif kind == CANCEL and model.queue:
                assert isinstance(arg, int)
                rid = list(model.queue)[arg % len(model.queue)]
                del model.queue[rid]
            else:
                continue
            before, waiting_before = model.counts(), list(model.queue)
            granted = model.grant()
            # 2. the same step on the store
            if kind == ARRIVE:
                tasks[number] = await arrive(coord, resources, at_once)
                if at_once and number not in granted:
                    del model.queue[number]  # queued, then timed out at once
                    with pytest.raises(BusyError):
                        await tasks.pop(number)
            elif kind == RELEASE:
                await coord.release(leases.pop(rid))
            else:
                tasks[rid].cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await tasks.pop(rid)
            # 3. every grant made has reached its task; compare and check
            await until(lambda: all(tasks[r].done() for r in granted),  # noqa: B023
                        timeout=2, what="the grants the model made")
            await settle()
            for rid in [r for r, task in tasks.items() if task.done()]:
                leases[rid] = tasks.pop(rid).result()
            await check(coord, model, leases, tasks, granted, before, waiting_before)
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        await coord.aclose()


async def arrive(coord: Coordinator, resources: Resources, at_once: bool) -> asyncio.Task[Lease]:
    """Start an acquire; return once the store has queued or granted it."""
    ticket = WaitTicket()
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
    assert all(n <= limit_of(r) for r, n in counts.items()), "1: over a limit"
    snap = await coord.snapshot()
    assert snap.held == dict(+counts), "2: store holders differ from whole leases"
    waiting = [(rid, model.queue[rid]) for rid in tasks]
    claimed = Counter(counts)  # slots held plus the places earlier waiters hold in line
    for rid, res in waiting:
        if consumer_blocked(res, counts):
            continue
        assert short_of(res, claimed), (
            f"3/5: waiter {rid} fits even after every earlier waiter's claim, yet waits"
        )
        claimed.update(r for r in res if not private(r))
    # 4: replay this step's grants in arrival order from the counts before them: a
    # waiter left waiting must not have fitted at its turn (nobody overtook it).
    replay = Counter(before)
    for rid in sorted(set(waiting_before) | granted):
        if rid in model.held:
            res = model.held[rid]
        elif rid in model.queue:
            res = model.queue[rid]
        else:
            continue  # timed out in this step
        if rid in granted:
            replay.update(res)
        elif not consumer_blocked(res, replay):
            assert short_of(res, replay), (
                f"4: waiter {rid} fitted at its turn but a later one was served"
            )
            replay.update(r for r in res if not private(r))  # nobody later takes its place


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
