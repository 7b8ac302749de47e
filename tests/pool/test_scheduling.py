"""Scheduling (issue 18, docs/scheduling.md) against real stand-in Spaces, per store.

* Work-conserving admission: an idle Space is served at once while a busy Space's
  backlog waits for its own slots; the busy Space's backlog still drains at its own
  rate while another Space is flooded; the global cap holds at the Spaces.
* Priority classes: an interactive request goes before waiting batch ones; a batch
  request that has waited ``POOL_BATCH_MAX_WAIT_S`` is not overtaken by newer
  interactive ones. Orders are taken from admission with a global limit of 1, where
  each grant follows the previous request's release: no timing decides them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devspaces import SpaceFleet
from pool import Pool, WaitTicket
from pool._consumer import CURRENT, Consumer
from tests.admission.conftest import STORES, make_url
from tests.admission.helpers import until
from tests.conftest import PoolMaker

D_S = 1.0  # how long each of A's requests runs at the Space


@pytest.fixture(params=STORES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh admission store of each kind."""
    yield from make_url(request.param, tmp_path, "sched")


def sched_pool(make_pool: PoolMaker, fleet: SpaceFleet, url: str, **kw: object) -> Pool:
    """A pool whose per-Space window stays at 4 (no growth during a test). Its requests
    are anonymous, one consumer (issue 28), whose cap is set out of the way here: these
    tests are about the shared resources."""
    settings: dict[str, object] = {
        "coordinator_url": url, "global_max_concurrent": 8, "window_initial": 4,
        "window_grow_after": 1000, "queue_timeout_s": 30.0, "lease_ttl_s": 5.0,
        "anonymous_max_concurrent": 1000,
    }  # fmt: skip
    settings.update(kw)
    return make_pool(fleet, **settings)


async def queued_on(pool: Pool, space: str, n: int) -> None:
    """Return once ``n`` requests wait for ``space`` in the store."""
    async def check() -> bool:
        return (await pool.coordinator.snapshot()).queued.get(f"space:{space}", 0) >= n

    deadline = time.monotonic() + 10
    while not await check():
        assert time.monotonic() < deadline, f"{n} waiters for {space} never queued"
        await asyncio.sleep(0.02)


async def test_an_idle_space_is_not_held_behind_a_busy_ones_backlog(
    url: str, clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """14 requests pinned to A (window 4: 10 wait), then one for B: B is admitted before
    any of A's waiting requests (under the previous rule it waited for most of them)
    and served within a round of A's; A's 14 are all served; the cap of 8 holds."""
    pool = sched_pool(make_pool, clean_fleet, url)
    await pool.start()
    order: list[str] = []

    async def admitted(space: str) -> None:
        order.append(space)

    a_calls = [asyncio.create_task(pool.predict("/echo", f"a{i}", D_S, space="alpha",
                                                on_admitted=admitted))
               for i in range(14)]  # fmt: skip
    await queued_on(pool, "alpha", 10)
    sent = time.monotonic()
    b = await pool.predict("/echo", "b", 0.2, space="beta", on_admitted=admitted)
    b_wait = time.monotonic() - sent
    print(f"\n[{pool.coordinator.store}] B served in {b_wait:.2f} s behind A's backlog of 10")
    assert b.result == "beta:b"
    ahead = order.index("beta")  # A's first 4 may finish connecting after B
    assert ahead <= 4, f"B admitted after {ahead - 4} of A's waiting requests"
    # The 1 s goal is the benchmark's (0.30 s median, BENCHMARKS.md); on a loaded CI
    # box the bound here is one round of A's requests.
    assert b_wait < 1.0 + D_S, f"B waited {b_wait:.2f} s behind another Space's backlog"
    done = await asyncio.gather(*a_calls)
    assert sorted(p.result for p in done) == sorted(f"alpha:a{i}" for i in range(14))
    assert clean_fleet["alpha"].stats().peak <= 4
    assert clean_fleet.concurrent_peak() <= 8


async def test_a_busy_spaces_backlog_drains_at_its_own_rate_while_another_is_flooded(
    url: str, clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """A's 12 requests (window 4: 3 rounds) keep A's 4 slots while 30 long requests
    flood B under a global cap of 6: B gets the 2 free global slots and never one that
    an A release frees, until A's backlog is admitted (order of admission, no timing)."""
    pool = sched_pool(make_pool, clean_fleet, url, global_max_concurrent=6)
    await pool.start()
    order: list[str] = []

    async def admitted(space: str) -> None:
        order.append(space)

    def call(space: str, delay: float) -> asyncio.Task[object]:
        return asyncio.create_task(
            pool.predict("/echo", "x", delay, space=space, on_admitted=admitted)
        )

    d = 0.5
    a_calls = [call("alpha", d) for _ in range(12)]
    await queued_on(pool, "alpha", 8)
    flood_from = time.monotonic()
    b_calls = [call("beta", 5.0) for _ in range(30)]  # they outlast A's backlog
    try:
        await asyncio.gather(*a_calls)
        a_drained = time.monotonic() - flood_from
    finally:
        for task in b_calls:
            task.cancel()
        await asyncio.gather(*b_calls, return_exceptions=True)
    print(f"\n[{pool.coordinator.store}] A's backlog drained in {a_drained:.2f} s "
          f"(3 rounds of {d} s) while B was flooded")  # fmt: skip
    # A's window cannot grow here, but the Space's queue may push it down (congested,
    # pool/resilience/_health.py): B may then take the slots A gave up, no others.
    window = (await pool.stats())["pools"]["alpha"]["window"]["current"]
    last_a = len(order) - 1 - order[::-1].index("alpha")
    assert order[:last_a].count("beta") <= 6 - window, "B took a slot an A release freed"
    assert clean_fleet["alpha"].stats().peak <= 4
    assert clean_fleet.concurrent_peak() <= 6


async def test_interactive_requests_go_before_waiting_batch_ones(
    url: str, clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """Global cap full, 20 batch requests waiting: an interactive request is admitted at
    the next release; the batch ones follow in their order."""
    pool = sched_pool(make_pool, clean_fleet, url, global_max_concurrent=1)
    await pool.start()
    order: list[str] = []

    def call(name: str, delay: float, priority: str) -> asyncio.Task[object]:
        async def admitted(_space: str) -> None:
            order.append(name)

        return asyncio.create_task(pool.predict(
            "/echo", name, delay, space="alpha", priority=priority, on_admitted=admitted,
        ))  # fmt: skip

    holder = call("holder", 0.5, "interactive")
    await until(lambda: order == ["holder"], what="the holder's admission")
    batch = [call(f"b{i}", 0.02, "batch") for i in range(20)]
    await queued_on(pool, "alpha", 20)
    interactive = call("i", 0.02, "interactive")
    await queued_on(pool, "alpha", 21)
    stats = await pool.stats()
    assert stats["totalQueuedByClass"] == {"interactive": 1, "batch": 20}
    await asyncio.gather(holder, interactive, *batch)
    assert order == ["holder", "i", *(f"b{i}" for i in range(20))]


async def test_a_consumers_default_class_applies_where_a_call_asks_none(
    url: str, clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """An API key with a default class (pool/_consumer.py): its calls that ask for no
    class wait as that class, whichever face made them (the front asks none); one that
    asks for a class keeps it."""
    pool = sched_pool(make_pool, clean_fleet, url, global_max_concurrent=1)
    await pool.start()
    admitted: list[str] = []

    async def note(space: str) -> None:
        admitted.append(space)

    holder = asyncio.create_task(
        pool.predict("/echo", "holder", 0.5, space="alpha", on_admitted=note)
    )
    await until(lambda: admitted == ["alpha"], what="the holder's admission")
    token = CURRENT.set(Consumer("team-batch", "k-sched", "batch"))
    try:
        calls = [asyncio.create_task(pool.predict("/echo", "x", 0.01, space="alpha")),
                 asyncio.create_task(pool.predict("/echo", "y", 0.01, space="alpha")),
                 asyncio.create_task(pool.predict("/echo", "z", 0.01, space="alpha",
                                                  priority="interactive"))]  # fmt: skip
    finally:
        CURRENT.reset(token)
    await queued_on(pool, "alpha", 3)
    assert (await pool.stats())["totalQueuedByClass"] == {"interactive": 1, "batch": 2}
    await asyncio.gather(holder, *calls)


async def test_an_aged_batch_request_is_not_overtaken_by_newer_interactive_ones(
    url: str, clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """POOL_BATCH_MAX_WAIT_S: a batch request that waited past it ranks as interactive,
    before newer interactive ones; a fresh batch request still goes after them."""
    pool = sched_pool(make_pool, clean_fleet, url, global_max_concurrent=1,
                      batch_max_wait_s=0.3)  # fmt: skip
    await pool.start()
    order: list[str] = []

    def call(name: str, delay: float, ticket: WaitTicket) -> asyncio.Task[object]:
        async def admitted(_space: str) -> None:
            order.append(name)

        return asyncio.create_task(pool.predict(
            "/echo", name, delay, space="alpha", ticket=ticket, on_admitted=admitted,
        ))  # fmt: skip

    # The holder runs until every other request has queued behind it (2.5 s: a loaded
    # run needed more than 0.8 s to queue them, and the old batch request was admitted
    # before the interactive ones arrived).
    holder = call("holder", 2.5, WaitTicket())
    await until(lambda: order == ["holder"], what="the holder's admission")
    old = WaitTicket(priority="batch")
    calls = [call("old-batch", 0.02, old)]
    await until(lambda: old.position > 0, what="the batch request to queue")
    await asyncio.sleep(0.4)  # real time for it to age past POOL_BATCH_MAX_WAIT_S
    calls += [call(f"i{i}", 0.02, WaitTicket()) for i in range(3)]
    await queued_on(pool, "alpha", 4)
    calls.append(call("new-batch", 0.02, WaitTicket(priority="batch")))
    await queued_on(pool, "alpha", 5)
    await asyncio.gather(holder, *calls)
    assert order == ["holder", "old-batch", "i0", "i1", "i2", "new-batch"]
