"""The grant rule shared by every coordinator store.

A request needs one slot of each of its resources, all at once. Resources come in
two classes:

* **shared** resources (``backend:global``, ``space:<name>``) that many consumers
  compete for, and
* **private** resources (``consumer:<hash>``) that only one consumer's requests use.

Waiters are ranked: by class first (``interactive`` before ``batch``; a batch waiter
that has waited ``POOL_BATCH_MAX_WAIT_S`` ranks as interactive), then by arrival.
The rule, applied to the waiters in rank order, over counts that start as the slots
held::

    for w in waiters (best rank first):
        if some resource of w is full:    skip w; w holds its place on the full
                                          shared resources only                    (1)
        else:                             grant w; count its slots                 (2)

A full shared resource stays full for the rest of the pass (counts only grow), so
"holding a place" on it needs no bookkeeping: every later waiter that needs it is
skipped too. A waiter is *blocked on* the shared resources that are full at its
turn; it claims nothing on the others.

Properties (SPEC 4.5), proven for every store by ``tests/admission/test_properties.py``:

(a) **work-conserving across Spaces**: a request for a Space with a free slot is
    never delayed by waiters of *another* Space while ``backend:global`` has a slot
    that no earlier waiter blocked on it needs. A waiter blocked only by its Space
    claims no global slot: every holder of a Space slot also holds a global slot,
    so the release that frees its Space slot frees a global slot with it.
(b) **FIFO per resource** (rank order), among the waiters that wait for it: once a
    resource is full in a pass, no later waiter gets it in that pass.
(c) **no starvation**: a waiter blocked by its Space is admitted within the holds
    ahead of it on that Space, however many requests other Spaces receive
    meanwhile: the release of a slot on its Space frees a global slot too, and the
    waiter comes before every later arrival in the pass that follows.
(d) all-or-nothing grants (property 2) that never exceed a limit (property 1); a
    waiter held back only by its own ``consumer:`` limit holds no place anywhere
    (no monopoly, property 3); a slot stays idle only while a waiter ranked before
    every waiter that could use it is blocked on it (property 5).

The previous rule (until issue 18) set aside one slot of *every* shared resource of a
blocked waiter, so a busy Space's backlog froze the global resource for every other
Space (head-of-line blocking: B waited 8.3 s for a free slot, docs/scheduling.md).

**Lanes.** Waiters with the same shared resources form a *lane* (``lane_of``); the
stores keep each lane, per class, in rank order. Once a lane's head is blocked on a
shared resource, the rest of the lane is too, so the pass merges the lanes' heads and
drops a lane at its first blocked waiter: a hand-off costs O(lanes + grants + waiters
held back by their consumer limit), flat in the queue length.

The function is pure and has no ``await``; the Redis store runs the same rule in a Lua
script (:mod:`pool.admission._redis`). The memory and SQLite stores keep the same rule
as indexes between passes instead (issue 39: :mod:`pool.admission._ready`,
:mod:`pool.admission._sqlite_index`), so that a pass reads only the lanes that can be
granted, not every lane: flat in the fleet and in a consumer's backlog too.
``plan_grants`` stays the rule's plain statement (``tests/admission/test_coordinator``).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

from .._consumer import CONSUMER_PREFIX as CONSUMER_PREFIX

GLOBAL_RESOURCE = "backend:global"
SPACE_PREFIX = "space:"

INTERACTIVE = "interactive"
BATCH = "batch"
PRIORITIES = (INTERACTIVE, BATCH)
RANK = {INTERACTIVE: 0, BATCH: 1}  # a waiter's class rank; lower goes first

K = TypeVar("K", bound=Hashable)
Order = tuple[int, float]  # (class rank, arrival): lower goes first
Entry = tuple[K, Sequence[str], Order]


def is_private(resource: str) -> bool:
    """True for resources used by one consumer only."""
    return resource.startswith(CONSUMER_PREFIX)


def lane_of(resources: Iterable[str]) -> str:
    """The lane of a waiter: its shared resources, sorted, comma-joined."""
    return ",".join(sorted(r for r in resources if not is_private(r)))


def lane_open(lane: str, held: Mapping[str, int], limit_of: Callable[[str], int]) -> bool:
    """False when a shared resource of ``lane`` is full before the pass: nobody of the
    lane can be granted in it, so a store need not read the lane at all."""
    return all(held.get(r, 0) < limit_of(r) for r in lane.split(",") if r)


def rank_of(priority: str, ages_at: float, now: float) -> int:
    """The class rank at ``now``: a batch waiter ranks as interactive from ``ages_at``."""
    return 0 if priority == INTERACTIVE or ages_at <= now else RANK[BATCH]


def plan_grants(
    lanes: Iterable[Iterable[Entry[K]]],
    held: Mapping[str, int],
    limit_of: Callable[[str], int],
) -> list[K]:
    """Return the keys of the waiters to grant now, best rank first (see module doc).

    ``lanes`` are the waiters grouped so that each group is in rank order (``Order``)
    and a blocked waiter blocks the rest of its group: a lane, or one class of a lane.
    Each may be a lazy iterable; it is read no further than its first waiter blocked
    on a shared resource.
    """
    counts = dict(held)
    heads: list[tuple[Order, int, Entry[K], Iterator[Entry[K]]]] = []
    for number, lane in enumerate(lanes):
        items = iter(lane)
        first = next(items, None)
        if first is not None:
            heads.append((first[2], number, first, items))
    heapq.heapify(heads)
    granted: list[K] = []
    while heads:
        _, number, (key, resources, _order), items = heapq.heappop(heads)
        if any(not is_private(r) and counts.get(r, 0) >= limit_of(r) for r in resources):
            continue  # (1) blocked on a shared resource: so is the rest of its lane
        if all(counts.get(r, 0) < limit_of(r) for r in resources):  # (2)
            for r in resources:
                counts[r] = counts.get(r, 0) + 1
            granted.append(key)
        # else: (1) held back by its own consumer limit only: no place anywhere
        following = next(items, None)
        if following is not None:
            heapq.heappush(heads, (following[2], number, following, items))
    return granted


def queue_positions(
    waiters: Iterable[Entry[K]],
    held: Mapping[str, int],
    limit_of: Callable[[str], int],
    wanted: Iterable[K],
) -> dict[K, int]:
    """1-based positions of the ``wanted`` waiters, counting who is actually ahead.

    ``v`` is ahead of ``w`` when it ranks before ``w`` and every shared resource that
    blocks ``v`` (is full now) also blocks ``w``: a waiter blocked by another Space, or
    held back by its own consumer limit only, is not ahead. ``waiters`` in any order.
    The waiters are grouped by the set that blocks them (a few sets: one per lane at
    most), so each position is a binary search per group: O(N log N) in all.
    """
    targets = set(wanted)
    blocked_of: dict[tuple[str, ...], frozenset[str]] = {}
    groups: dict[frozenset[str], list[Order]] = {}  # blocked set -> its waiters' ranks
    mine: list[tuple[K, frozenset[str], Order]] = []
    for key, resources, order in waiters:
        shape = tuple(resources)
        blocked = blocked_of.get(shape)
        if blocked is None:
            blocked = blocked_of[shape] = frozenset(
                r for r in shape if not is_private(r) and held.get(r, 0) >= limit_of(r)
            )
        if blocked:
            groups.setdefault(blocked, []).append(order)
        if key in targets:
            mine.append((key, blocked, order))
    for orders in groups.values():
        orders.sort()
    return {
        key: 1 + sum(bisect_left(orders, order) for s, orders in groups.items() if s <= blocked)
        for key, blocked, order in mine
    }


def newcomer_position(
    lanes: Iterable[tuple[str, int, int]],
    lane: str,
    rank: int,
    held: Mapping[str, int],
    limit_of: Callable[[str], int],
) -> int:
    """:func:`queue_positions` of a waiter that arrived last, from the lanes' sizes
    (``(lane, class rank, waiters)``, the newcomer not counted): O(lanes), not
    O(waiters). Every waiter of a lane is blocked by the same full resources."""

    def blocked(key: str) -> frozenset[str]:
        return frozenset(r for r in key.split(",") if r and held.get(r, 0) >= limit_of(r))

    mine = blocked(lane)
    ahead = 0
    for key, their_rank, count in lanes:
        theirs = blocked(key)
        if their_rank <= rank and theirs and theirs <= mine:
            ahead += count
    return 1 + ahead


def estimate_wait_s(position: int, capacity: int, mean_hold_s: float) -> float:
    """A rough wait estimate for the ``position``-th waiter (1-based)."""
    rounds = -(-max(position, 1) // max(capacity, 1))
    return max(1.0, rounds * max(mean_hold_s, 0.1))


UNLIMITED = 1 << 30


def limit_lookup(limits: Mapping[str, int]) -> Callable[[str], int]:
    """Resolve a resource's limit: its own entry, else its prefix's (``"consumer:"``)."""

    def limit_of(resource: str) -> int:
        found = limits.get(resource)
        if found is not None:
            return found
        prefix, sep, _ = resource.partition(":")
        found = limits.get(prefix + sep) if sep else None
        return UNLIMITED if found is None else found

    return limit_of


def bottleneck_capacity(resources: Sequence[str], limit_of: Callable[[str], int]) -> int:
    """The smallest limit among shared resources: how many are served per round."""
    caps = [limit_of(r) for r in resources if not is_private(r)]
    return min(caps) if caps else 1
