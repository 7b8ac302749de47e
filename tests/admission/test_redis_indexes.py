"""The Redis store's indexes (ready set, parked sub-lanes, consumer waits, liveness per
owner) grant exactly what the rule grants: random operation sequences up to 1,000
waiters over 100 Spaces, each operation's grants compared with
:func:`pool.admission._rule.plan_grants` over the whole state (issue 39).

The script is driven directly (as in ``test_redis_work.py``), so thousands of steps
take a few seconds.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import redis

from pool.admission import CONSUMER_PREFIX
from pool.admission._rule import Entry, lane_of, limit_lookup, plan_grants

from .conftest import REDIS_URL
from .helpers import GLOBAL
from .test_redis_work import Script, enqueue

# (class rank, ms until a batch waiter ranks as interactive). One setting per run, as
# POOL_BATCH_MAX_WAIT_S is one setting: batch waiters that never age within the test,
# or that rank as interactive (by arrival) at once.
INTERACTIVE, BATCH, AGED = (0, 600_000), (1, 600_000), (1, 0)


def ranks(cls: tuple[int, int]) -> int:
    """The rank the rule gives a waiter of this class now."""
    return 1 if cls == BATCH else 0


class Reference:
    """The waiters in arrival order, per lane and class; the holders; the rule."""

    def __init__(self, limits: dict[str, int]) -> None:
        self.limits = dict(limits)
        self.lanes: dict[tuple[str, int], list[tuple[str, tuple[str, ...], int]]] = {}
        self.waiting: dict[str, tuple[str, int]] = {}  # id -> its lane key
        self.held: dict[str, tuple[str, ...]] = {}
        self.seq = 0

    def arrive(self, wid: str, resources: tuple[str, ...], rank: int) -> None:
        self.seq += 1
        key = (lane_of(resources), rank)
        self.lanes.setdefault(key, []).append((wid, resources, self.seq))
        self.waiting[wid] = key

    def leave(self, wid: str) -> None:
        key = self.waiting.pop(wid)
        self.lanes[key] = [e for e in self.lanes[key] if e[0] != wid]

    def grant(self) -> set[str]:
        counts: dict[str, int] = {}
        for resources in self.held.values():
            for r in resources:
                counts[r] = counts.get(r, 0) + 1
        lanes = [lazy(entries, rank) for (_, rank), entries in self.lanes.items() if entries]
        granted = plan_grants(lanes, counts, limit_lookup(self.limits))
        for wid in granted:
            key = self.waiting[wid]
            self.held[wid] = next(e[1] for e in self.lanes[key] if e[0] == wid)
            self.leave(wid)
        return set(granted)


def lazy(entries: list[tuple[str, tuple[str, ...], int]], rank: int) -> Iterator[Entry[str]]:
    """One lane and class in rank order, read only as far as the rule reads it."""
    for wid, res, seq in entries:
        yield wid, res, (rank, seq)


@pytest.fixture
def prefix(redis_prefix: str) -> str:
    """A private prefix of the test Redis, deleted afterwards (conftest's)."""
    return redis_prefix


@pytest.mark.parametrize(("seed", "batch"), [(1, BATCH), (2, AGED)])
def test_random_operations_grant_what_the_rule_grants(
    prefix: str, seed: int, batch: tuple[int, int]
) -> None:
    """Arrivals (interactive, batch, aged batch; with and without the global resource, 40
    consumers), releases, cancels and global limit changes: after every operation the
    store has granted exactly the waiters the rule grants."""
    rng = random.Random(seed)
    classes = (INTERACTIVE, INTERACTIVE, batch)
    spaces = 100
    limits = {GLOBAL: 60, "space:": 2, CONSUMER_PREFIX: 3}
    with redis.Redis.from_url(REDIS_URL) as client:
        script = Script(client, prefix)
        script.start(limits)
        model = Reference(limits)
        # Fill fast: arrivals only, pipelined; the rule grants as they come.
        fill = [(f"f-{i}", request(rng, spaces), rng.choice(classes)) for i in range(1_000)]
        script.pipelined([enqueue(w, list(res), *cls) for w, res, cls in fill])
        for w, res, cls in fill:
            model.arrive(w, res, ranks(cls))
            model.grant()
        assert set(client.hkeys(prefix + "leases")) == {w.encode() for w in model.held}
        for step in range(700):
            kind = rng.choice(("arrive", "arrive", "release", "release", "cancel", "limit"))
            if kind == "arrive":
                wid, res, cls = f"a-{step}", request(rng, spaces), rng.choice(classes)
                model.arrive(wid, res, ranks(cls))
                result, _ = script.one(*enqueue(wid, list(res), *cls))
            elif kind == "release" and model.held:
                wid = rng.choice(sorted(model.held))
                del model.held[wid]
                result, _ = script.one("release", wid, 1.0)
            elif kind == "cancel" and model.waiting:
                wid = rng.choice(sorted(model.waiting))
                model.leave(wid)
                result, _ = script.one("withdraw", wid, "0")
                assert result[0] == "WAITING", (step, wid, result)
            elif kind == "limit":
                model.limits[GLOBAL] = rng.randint(20, 80)
                result, _ = script.one("set_limits", GLOBAL, model.limits[GLOBAL])
            else:
                continue
            expected = model.grant()
            assert set(result[1]) == expected, f"step {step} ({kind}): {result[1]} != {expected}"
        assert int(client.hlen(prefix + "waiters")) == len(model.waiting)
        assert int(client.zcard(prefix + "queue")) == len(model.waiting)


def request(rng: random.Random, spaces: int) -> tuple[str, ...]:
    """A request: mostly the global resource and a Space, often a consumer."""
    resources: tuple[str, ...] = (GLOBAL,) if rng.random() < 0.85 else ()
    resources += (f"space:{rng.randrange(spaces)}",)
    if rng.random() < 0.8:
        resources += (f"{CONSUMER_PREFIX}c{rng.randrange(40)}",)
    return resources
