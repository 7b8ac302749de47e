"""The work of one Redis admission script run is counted, not timed: it stays within a
constant from 1 to 10,000 waiters and from 1 to 1,000 Spaces (issue 39, item 5).

``admission.lua`` returns, after its results, its run's work: the Redis commands it ran
plus the elements they returned (so a command that reads a whole key counts its size).
These tests fill a private prefix of the test Redis with pipelined script runs (32
operations each), then run single operations on a small and on a large store and
compare their counts. The script is driven directly, as the store's client does.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from pool.admission import CONSUMER_PREFIX
from pool.admission._lua import load_script
from pool.admission._redis import _KEYS

from .conftest import REDIS_URL
from .helpers import GLOBAL

TTL_MS = 60_000
SLACK = 12  # what may differ between a small and a large store (a longer id, a tie)


class Script:
    """One owner's view of the admission script under a private prefix."""

    def __init__(self, client: redis.Redis, prefix: str, owner: str = "owner-a") -> None:
        self.client = client
        self.keys = [prefix + k for k in _KEYS]
        self.sha = client.script_load(load_script("admission.lua"))
        self.owner = owner
        self.epoch = ""
        self.work = 0

    def run(self, *ops: list[Any]) -> list[Any]:
        """One script run of ``ops`` (each ``[op, *args]``); its results."""
        args: list[Any] = ["chan:"]
        for op, *rest in ops:
            call = [op, self.owner, self.epoch, *rest]
            args += [len(call), *call]
        results = json.loads(self.client.evalsha(self.sha, len(self.keys), *self.keys, *args))
        self.work = results.pop()
        return list(results)

    def pipelined(self, ops: list[list[Any]]) -> None:
        """Many operations, 32 per script run, all runs in one pipeline."""
        pipe = self.client.pipeline(transaction=False)
        for i in range(0, len(ops), 32):
            args: list[Any] = ["chan:"]
            for op, *rest in ops[i : i + 32]:
                call = [op, self.owner, self.epoch, *rest]
                args += [len(call), *call]
            pipe.evalsha(self.sha, len(self.keys), *self.keys, *args)
        pipe.execute()

    def start(self, limits: dict[str, int]) -> None:
        flat: list[Any] = [len(limits)]
        for name, n in limits.items():
            flat += [name, n]
        self.epoch = str(self.run(["restore", "", "epoch-1", TTL_MS, "", *flat, 0, 0])[0][1])
        # A Redis younger than the TTL (a fresh CI server) starts in quarantine; these
        # tests are not about restarts (tests/chaos/test_store_restart.py is).
        self.client.hdel(self.keys[0], "quarantine")

    def one(self, op: str, *args: Any) -> tuple[list[Any], int]:
        """One operation alone in its run: its result and its work."""
        return self.run([op, *args])[0], self.work


def enqueue(wid: str, resources: list[str], rank: int = 0, ages_ms: int = 600_000) -> list[Any]:
    return ["enqueue", wid, json.dumps(resources), TTL_MS, rank, ages_ms]


@pytest.fixture
def prefix(redis_prefix: str) -> str:
    """A private prefix of the test Redis, deleted afterwards (conftest's)."""
    return redis_prefix


def crowd(script: Script, spaces: int, waiters: int, backlog: int = 0) -> None:
    """Every Space full (one holder each, and a few global slots free), then
    ``waiters`` queued round-robin over the Spaces, and ``backlog`` calls of consumer
    ``big`` queued past its limit on a free Space."""
    script.start({GLOBAL: spaces + 10, "space:": 1, CONSUMER_PREFIX: 4, "space:free": 10**6})
    ops = [enqueue(f"held-{s}", [GLOBAL, f"space:{s}"]) for s in range(spaces)]
    ops += [enqueue(f"w-{i}", [GLOBAL, f"space:{i % spaces}", f"{CONSUMER_PREFIX}{i % 97}"],
                    i % 2) for i in range(waiters)]  # fmt: skip
    big = CONSUMER_PREFIX + "big"
    ops += [enqueue(f"big-{i}", [GLOBAL, "space:free", big]) for i in range(4)]  # its limit
    ops += [enqueue(f"backlog-{i}", ["space:free", big]) for i in range(backlog)]
    script.pipelined(ops)


def costs(script: Script) -> dict[str, int]:
    """The work of each admission operation on the current store."""
    out: dict[str, int] = {}
    free = [GLOBAL, "space:free", CONSUMER_PREFIX + "other"]
    _, out["acquire (granted)"] = script.one(*enqueue("probe", free))
    _, out["release"] = script.one("release", "probe", 1.0)
    _, out["enqueue (queued)"] = script.one(*enqueue("late", [GLOBAL, "space:0"]))
    _, out["cancel"] = script.one("withdraw", "late", "0")
    _, out["hand-off"] = script.one("release", "held-0", 1.0)  # its Space's head is granted
    _, out["renew"] = script.one("renew", TTL_MS, 1)
    _, out["poll"] = script.one("poll", "w-1", "w-2")
    _, out["cancel head"] = script.one("withdraw", "w-1", "0")
    return out


@pytest.mark.parametrize(("spaces", "waiters"), [(1_000, 10_000), (1, 10_000), (1_000, 1_000)])
def test_each_operation_costs_the_same_on_a_crowded_store(
    prefix: str, spaces: int, waiters: int
) -> None:
    """acquire, release, enqueue, cancel, hand-off, renew, poll: the same work with
    ``waiters`` parked over ``spaces`` as with one waiter on one Space."""
    with redis.Redis.from_url(REDIS_URL) as client:
        small = Script(client, prefix + "small:")
        crowd(small, spaces=1, waiters=3)  # w-1, w-2 still queued after the hand-off
        large = Script(client, prefix + "large:")
        crowd(large, spaces=spaces, waiters=waiters)
        assert int(client.zcard(prefix + "large:queue")) == waiters
        base, crowded = costs(small), costs(large)
    grown = {op: (base[op], crowded[op]) for op in base if crowded[op] > base[op] + SLACK}
    assert not grown, f"work grew with the store (small, large): {grown}"


def test_another_consumers_cycle_ignores_a_backlog(prefix: str) -> None:
    """A consumer with 10,000 calls queued past its own limit: another consumer's
    acquire and release cost what they cost without that backlog."""
    with redis.Redis.from_url(REDIS_URL) as client:
        small = Script(client, prefix + "small:")
        crowd(small, spaces=1, waiters=1, backlog=0)
        large = Script(client, prefix + "large:")
        crowd(large, spaces=1, waiters=1, backlog=10_000)
        cycles = []
        for script in (small, large):
            other = [GLOBAL, "space:free", CONSUMER_PREFIX + "other"]
            _, acquire = script.one(*enqueue("o-1", other))
            _, release = script.one("release", "o-1", 1.0)
            cycles.append(acquire + release)
        # And when the backlog's consumer frees a slot, one of its calls is granted at
        # bounded cost too.
        _, freed = large.one("release", "big-0", 1.0)
    assert cycles[1] <= cycles[0] + SLACK, f"work with / without the backlog: {cycles}"
    assert freed <= cycles[0] + 4 * SLACK, f"the backlog's hand-off cost {freed}"


def test_a_hand_off_through_the_global_cap_ignores_the_fleet(prefix: str) -> None:
    """The global cap is the bottleneck and 1,000 waiters wait for it: a release hands
    the slot on with the same work whether they wait for 1 Space or for 1,000."""
    with redis.Redis.from_url(REDIS_URL) as client:
        works = []
        for spaces in (1, 1_000):
            script = Script(client, f"{prefix}{spaces}:")
            script.start({GLOBAL: 2, "space:": 10**6})
            ops = [enqueue(f"h-{i}", [GLOBAL, "space:held"]) for i in range(2)]
            ops += [enqueue(f"w-{i}", [GLOBAL, f"space:{i % spaces}"]) for i in range(1_000)]
            script.pipelined(ops)
            hand_offs = []
            for i in range(2):
                _, work = script.one("release", f"h-{i}", 1.0)
                hand_offs.append(work)
            assert int(client.hlen(f"{prefix}{spaces}:leases")) == 2  # w-0 and w-1 now
            works.append(max(hand_offs))
    assert works[1] <= works[0] + SLACK, f"hand-off work, 1 Space / 1,000 Spaces: {works}"


def test_a_consumer_freeing_a_slot_takes_back_a_bounded_share_per_operation(
    prefix: str,
) -> None:
    """100 calls held back by their consumer, each on a Space that is full by then: the
    consumer's release takes back at most 64 of them (the rest on the next operation),
    and a Space freed later grants its call."""
    with redis.Redis.from_url(REDIS_URL) as client:
        script = Script(client, prefix)
        script.start({GLOBAL: 1_000, "space:": 1, CONSUMER_PREFIX: 1})
        big = CONSUMER_PREFIX + "big"
        assert script.one(*enqueue("big-0", ["space:x", big]))[0][1] == ["big-0"]
        script.pipelined([enqueue(f"b-{i}", [f"space:{i}", big]) for i in range(100)])
        others = [enqueue(f"o-{i}", [f"space:{i}", f"{CONSUMER_PREFIX}o{i}"]) for i in range(100)]
        script.pipelined(others)  # every Space of big's calls is full now
        assert int(client.zcard(prefix + "cwait")) == 100
        result, work = script.one("release", "big-0", 1.0)
        assert not result[1] and int(client.zcard(prefix + "cwait")) == 100 - 64
        assert work < 64 * 40, f"the release did {work} units of work"
        script.one("poll")
        assert int(client.zcard(prefix + "cwait")) == 0
        result, _ = script.one("release", "o-50", 1.0)
        assert result[1] == ["b-50"]


def test_a_dead_owner_is_reclaimed_in_bounded_steps(prefix: str) -> None:
    """An owner with 2,000 entries stops renewing: each later operation drops at most a
    bounded share of them, and all are gone after a few operations."""
    with redis.Redis.from_url(REDIS_URL) as client:
        dead = Script(client, prefix, owner="dead")
        dead.start({GLOBAL: 10, "space:": 1})
        dead.pipelined([enqueue(f"d-{i}", [GLOBAL, f"space:{i % 50}"]) for i in range(2_000)])
        client.zadd(prefix + "owners", {"dead": 0})  # its deadline has passed
        alive = Script(client, prefix, owner="alive")
        alive.epoch = dead.epoch
        works = []
        while client.zlexcount(prefix + "owned", "[dead\x01", "[dead\x01\xff"):
            alive.one("poll")
            works.append(alive.work)
            assert len(works) < 100, "the dead owner's entries are not going away"
    assert max(works) < 128 * 40, f"one operation did {max(works)} units of work"
    assert int(client.zcard(prefix + "queue")) == 0
