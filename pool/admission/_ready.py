"""The grant rule kept as indexes, so that its cost is flat in the queue, the fleet and a
backlog (issue 39); the in-process store (``memory://``) uses it.

:func:`~pool.admission._rule.plan_grants` reads every lane with a waiter at each pass:
O(lanes) per hand-off, so 1,000 Spaces made each release cost 1,000 lane reads, and a
consumer's backlog was read again at every pass. This module applies the same rule
(all-or-nothing, rank order, a full shared resource blocks its lane, a waiter held back
by its own consumer limit holds no place) over state that is kept between passes:

* a *candidate* is a lane (its waiters in rank order, read at the head only) or one
  waiter held back by its consumer, taken out of its lane;
* between two passes, every candidate is *parked* under one resource that is full and
  that it needs: ``parked[r]`` is a heap of candidates by their head's rank. A full
  resource stays full until a slot of it is freed, so nobody parked under it can be
  granted before then, and nobody needs to look at them;
* a release *wakes* the resources it frees; a pass merges the heaps of the woken,
  not-full resources (a handful) with the newcomers, pops the best candidate, checks
  it (a full shared resource: park the lane under it; a full consumer: park the waiter
  under its consumer; else grant and push the lane's next waiter) and stops when
  every heap it merges is empty or full again.

Popping candidates in rank order among those that can still be granted, and granting
each one that fits, is exactly :func:`plan_grants`' pass (its counts only grow, so a
candidate that did not fit at its turn never fits later in the pass). Each grant,
release, cancel or timeout touches O(1) candidates and O(log n) heap entries; stale
heap entries (a lane whose head changed) are skipped by a stamp. A batch waiter's rank
changes when it ages: an *aging* heap re-ranks a candidate at that moment.

**Positions.** A waiter's position is computed for one waiter at a time, in
O(log n), from per-resource order statistics (:class:`Ranks`): ``1 +`` the waiters
ranked before it that need one of the shared resources blocking it now (capped by all
the waiters ranked before it). It counts everybody who is actually ahead (those blocked
only by resources that block this waiter too, docs/scheduling.md) and may count some
who are not: an upper bound.

``work`` counts the entries touched (candidates checked, heap entries pushed and
popped, waiters added or removed) so that tests can assert it stays flat
(``tests/admission/test_work.py``); ``positions`` counts the positions computed.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, MutableMapping

from ._rule import Order, is_private, lane_of

_COMPACT_MIN = 64  # a Ranks rebuilds itself once it has this many dead entries and more
# dead than live ones: amortized O(1) per removal
_MIN_SHIFT = 6  # a Ranks' blocks hold at least 2**6 entries


class Ranks:
    """Live arrivals in arrival order: how many arrived before a given one.

    An append-only array of sequence numbers (``array``: one flat block of memory, so a
    bisection reads no scattered objects), a live flag per entry and the live count
    of each block of ``2**shift`` entries. Each waiter knows its entry's index (its
    *slot*, kept right when the array is compacted), so a removal is two O(1) updates,
    no search; :meth:`before` bisects (in C), then adds the counts of the blocks before
    the entry and counts the live flags of its own block, both in C, over O(√n) items:
    the blocks are kept no more numerous than the entries of one (their size doubles as
    the array grows). Compacted when half of it is dead: amortized O(1) per removal.
    """

    __slots__ = ("_alive", "_blocks", "_dead", "_seqs", "_shift", "_waiters", "total")

    def __init__(self) -> None:
        self._seqs = array("q")
        self._waiters: list[Waiter] = []  # whose entry each is (dead ones too)
        self._alive = bytearray()
        self._blocks: list[int] = []  # live entries in each block of 2**_shift entries
        self._shift = _MIN_SHIFT
        self._dead = 0
        self.total = 0

    def add(self, seq: int, waiter: Waiter) -> int:
        """Record an arrival; ``seq`` is larger than every one recorded before. Returns
        its slot (``waiter.slots`` keeps it, kept right by compactions)."""
        index = len(self._seqs)
        self._seqs.append(seq)
        self._waiters.append(waiter)
        self._alive.append(1)
        block = index >> self._shift
        if block < len(self._blocks):
            self._blocks[block] += 1
        else:
            self._blocks.append(1)
            if len(self._blocks) > 1 << self._shift:  # twice as many entries per block
                pairs = self._blocks
                self._blocks = [sum(pairs[i : i + 2]) for i in range(0, len(pairs), 2)]
                self._shift += 1
        self.total += 1
        return index

    def remove(self, slot: int) -> None:
        """Remove the arrival at ``slot`` (what :meth:`add` answered, or a compaction
        set since)."""
        if not self._alive[slot]:
            return
        self._alive[slot] = 0
        self._blocks[slot >> self._shift] -= 1
        self.total -= 1
        self._dead += 1
        if self._dead >= _COMPACT_MIN and self._dead > self.total:
            self._compact()

    def before(self, seq: int) -> int:
        """How many live arrivals have a smaller sequence number than ``seq``."""
        index = bisect_left(self._seqs, seq)
        block = index >> self._shift
        return sum(self._blocks[:block]) + self._alive.count(1, block << self._shift, index)

    def _compact(self) -> None:
        """Drop the dead entries; the blocks are counted again in one linear sweep."""
        alive = self._alive
        self._seqs = array("q", (s for s, live in zip(self._seqs, alive, strict=True) if live))
        self._waiters = [w for w, live in zip(self._waiters, alive, strict=True) if live]
        for slot, waiter in enumerate(self._waiters):
            waiter.slots[waiter.ranks.index(self)] = slot
        size = len(self._seqs)
        self._alive = bytearray(b"\x01" * size)
        shift = _MIN_SHIFT
        while size > 1 << (2 * shift):
            shift += 1
        self._shift = shift
        self._blocks = [min(1 << shift, size - i) for i in range(0, size, 1 << shift)]
        self._dead, self.total = 0, size


class Waiter:
    """One waiter as the index sees it."""

    __slots__ = ("ages_at", "batch", "key", "lane", "ranks", "resources", "seq", "single",
                 "slots")  # fmt: skip

    def __init__(
        self, key: str, resources: tuple[str, ...], seq: int, batch: bool, ages_at: float
    ) -> None:
        self.key = key
        self.resources = resources
        self.seq = seq
        self.batch = batch
        self.ages_at = ages_at
        self.lane: _Lane | None = None  # None while held back by its consumer
        self.single: _Single | None = None
        self.ranks: tuple[Ranks, ...] = ()  # the order statistics it is counted in...
        self.slots: list[int] = []  # ...and its entry in each

    def order(self, now: float) -> Order:
        return (1 if self.batch and self.ages_at > now else 0, self.seq)


class _Candidate:
    __slots__ = ("place", "stamp")

    def __init__(self) -> None:
        self.stamp = -1  # the stamp of its one valid heap entry; -1: in no heap
        self.place = ""  # the resource it is parked under ("": the pass's own heap)

    def head(self) -> Waiter:
        raise NotImplementedError


class _Lane(_Candidate):
    """Waiters with the same shared resources and class, in arrival (= rank) order.

    A waiter that leaves (granted, cancelled, timed out, taken out) only says so
    (``waiter.lane = None``, ``live``): it is dropped from the deque when it reaches the
    front, or when the dead outnumber the living. So a cancel does not touch the deque;
    if it was the head, the lane's heap entry keeps the old head's order, earlier than
    the new head's, and the pass ranks it again when it pops it."""

    __slots__ = ("dead", "live", "name", "waiters")

    def __init__(self, name: tuple[str, int]) -> None:
        super().__init__()
        self.name = name
        self.waiters: deque[Waiter] = deque()
        self.live = 0
        self.dead = 0  # left, still in the deque

    def head(self) -> Waiter:
        waiters = self.waiters
        while waiters[0].lane is not self:
            waiters.popleft()
            self.dead -= 1
        return waiters[0]

    def leave(self, waiter: Waiter) -> None:
        waiter.lane = None
        self.live -= 1
        self.dead += 1
        if self.dead > self.live + _COMPACT_MIN:  # amortized O(1) per departure
            self.waiters = deque(w for w in self.waiters if w.lane is self)
            self.dead = 0


class _Single(_Candidate):
    """A waiter held back by its own consumer limit, out of its lane."""

    __slots__ = ("waiter",)

    def __init__(self, waiter: Waiter) -> None:
        super().__init__()
        self.waiter = waiter

    def head(self) -> Waiter:
        return self.waiter


_Entry = tuple[Order, int, _Candidate]


class GrantIndex:
    """The waiters of one store, indexed for the grant pass and for positions."""

    def __init__(self) -> None:
        self._waiters: dict[str, Waiter] = {}
        self._lanes: dict[tuple[str, int], _Lane] = {}
        self._parked: dict[str, list[_Entry]] = {}
        self._fresh: list[_Entry] = []  # candidates to check at the next pass
        self._woken: set[str] = set()
        self._aging: list[tuple[float, int, _Candidate]] = []
        self._stamps = itertools.count()
        self._ranks: dict[tuple[str, int], Ranks] = {}  # (shared resource or "", class)
        self._live: dict[str, int] = {}  # valid entries per heap ("": the pass's own)
        self.work = 0
        self.positions = 0  # positions computed (each O(log n)), apart from ``work``

    def __len__(self) -> int:
        return len(self._waiters)

    def __contains__(self, key: object) -> bool:
        return key in self._waiters

    def add(
        self,
        key: str,
        resources: tuple[str, ...],
        seq: int,
        *,
        batch: bool,
        ages_at: float,
        now: float,
    ) -> Waiter:
        """Queue a waiter; ``seq`` is larger than every one given before."""
        return self.insert(Waiter(key, resources, seq, batch, ages_at), now)

    def get(self, key: str) -> Waiter | None:
        return self._waiters.get(key)

    def insert(self, waiter: Waiter, now: float) -> Waiter:
        """Queue ``waiter`` (a store may pass its own subclass, carrying its future);
        its ``seq`` is larger than every one given before."""
        key, resources, seq, batch = waiter.key, waiter.resources, waiter.seq, waiter.batch
        self._waiters[key] = waiter
        name = (lane_of(resources), int(batch))
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = _Lane(name)
        lane.waiters.append(waiter)
        lane.live += 1
        waiter.lane = lane
        if lane.live == 1:
            self._push(lane, "", waiter.order(now))  # checked at the next pass
        counted = []
        for r in self._ranked(resources):
            ranks = self._ranks.get((r, int(batch)))
            if ranks is None:
                ranks = self._ranks[(r, int(batch))] = Ranks()
            counted.append(ranks)
            waiter.slots.append(ranks.add(seq, waiter))
        waiter.ranks = tuple(counted)
        self.work += 1
        return waiter

    def remove(self, key: str, now: float) -> Waiter | None:
        """Take a waiter out (granted elsewhere, cancelled, timed out)."""
        waiter = self._waiters.pop(key, None)
        if waiter is None:
            return None
        self.work += 1
        for ranks, slot in zip(waiter.ranks, waiter.slots, strict=True):
            ranks.remove(slot)
        lane, single = waiter.lane, waiter.single
        if single is not None:
            self._unlist(single)  # its heap entry is stale now
            waiter.single = None
        elif lane is not None:
            lane.leave(waiter)  # if it was the head: see _Lane, and the pass
            if not lane.live:
                self._unlist(lane)
                del self._lanes[lane.name]
        return waiter

    def freed(self, resources: Iterable[str]) -> None:
        """Slots of these resources were freed: the next pass looks at who waits for them."""
        self._woken.update(r for r in resources if r in self._parked)

    def wake_all(self) -> None:
        """Limits changed: the next pass looks at every resource somebody waits for."""
        self._woken.update(self._parked)

    def grant_pass(
        self, held: MutableMapping[str, int], limit_of: Callable[[str], int], now: float
    ) -> list[Waiter]:
        """The grant rule's pass: the waiters granted, in rank order, already counted
        in ``held`` and out of the index."""
        self._age(now)
        sources: list[tuple[str, list[_Entry]]] = [("", self._fresh)]
        for r in self._woken:
            heap = self._parked.get(r)
            if heap:
                sources.append((r, heap))
        self._woken.clear()
        granted: list[Waiter] = []
        while True:
            best: list[_Entry] | None = None
            for name, heap in sources:
                if name and held.get(name, 0) >= limit_of(name):
                    continue  # full again: everybody under it is blocked
                while heap and heap[0][1] != heap[0][2].stamp:
                    heapq.heappop(heap)  # stale
                    self.work += 1
                if heap and (best is None or heap[0] < best[0]):
                    best = heap
            if best is None:
                break
            order, _, candidate = heapq.heappop(best)
            self.work += 1
            self._unlist(candidate)
            waiter = candidate.head()
            if waiter.order(now) != order and isinstance(candidate, _Lane):
                self._push(candidate, candidate.place, waiter.order(now))  # its head left
                continue
            blocked = _first_full(waiter.resources, held, limit_of, private=False)
            if blocked is not None:  # (1): the lane waits under it
                self._push(candidate, blocked, order)
                continue
            consumer = _first_full(waiter.resources, held, limit_of, private=True)
            if consumer is not None:  # held back by its own consumer: no place anywhere
                if isinstance(candidate, _Lane):
                    self._take_out(candidate, waiter, now)
                    single = waiter.single = _Single(waiter)
                    self._push(single, consumer, order)
                else:
                    self._push(candidate, consumer, order)
                continue
            for r in waiter.resources:  # (2)
                held[r] = held.get(r, 0) + 1
            self.remove(waiter.key, now)
            if isinstance(candidate, _Lane) and candidate.live:
                self._push(candidate, "", candidate.head().order(now))
            granted.append(waiter)
        for name, heap in sources:
            if name and not heap and self._parked.get(name) is heap:
                del self._parked[name]
                self._live.pop(name, None)
        return granted

    def position(
        self, key: str, held: MutableMapping[str, int], limit_of: Callable[[str], int],
        now: float,
    ) -> tuple[int, int]:  # fmt: skip
        """``(position, capacity)`` of a queued waiter, O(log n): position is ``1 +`` an
        upper bound of the waiters actually ahead (module doc); capacity is the smallest
        limit among the shared resources that block it (1 when none does)."""
        waiter = self._waiters.get(key)
        if waiter is None:
            return 0, 1
        self.positions += 1
        blocking = [r for r in waiter.resources
                    if not is_private(r) and held.get(r, 0) >= limit_of(r)]  # fmt: skip
        if not blocking:
            return 1, 1
        counted = sum(self._ahead(r, waiter, now) for r in blocking)
        if len(blocking) > 1:  # a waiter ahead may be counted once per resource
            counted = min(counted, self._ahead("", waiter, now))
        return 1 + counted, min(limit_of(r) for r in blocking)

    def _ahead(self, resource: str, waiter: Waiter, now: float) -> int:
        interactive = self._ranks.get((resource, 0))
        batch = self._ranks.get((resource, 1))
        count = batch.before(waiter.seq) if batch is not None else 0
        if interactive is not None:
            aged = not waiter.batch or waiter.ages_at <= now
            count += interactive.before(waiter.seq) if aged else interactive.total
        return count

    def _ranked(self, resources: tuple[str, ...]) -> list[str]:
        return ["", *(r for r in resources if not is_private(r))]

    def _take_out(self, lane: _Lane, waiter: Waiter, now: float) -> None:
        """Move a lane's head out of it; the lane goes on with its next waiter."""
        lane.leave(waiter)
        if lane.live:
            self._push(lane, "", lane.head().order(now))
        else:
            del self._lanes[lane.name]

    def _unlist(self, candidate: _Candidate) -> None:
        """Its heap entry, if any, is stale from now on."""
        if candidate.stamp >= 0:
            candidate.stamp = -1
            self._live[candidate.place] -= 1

    def _push(self, candidate: _Candidate, place: str, order: Order) -> None:
        self._unlist(candidate)
        stamp = next(self._stamps)
        candidate.stamp, candidate.place = stamp, place
        heap = self._fresh if not place else self._parked.setdefault(place, [])
        live = self._live[place] = self._live.get(place, 0) + 1
        if len(heap) >= 2 * live + _COMPACT_MIN:  # mostly stale: amortized O(1) per push
            heap[:] = [e for e in heap if e[1] == e[2].stamp]
            heapq.heapify(heap)
        heapq.heappush(heap, (order, stamp, candidate))
        self.work += 1
        if order[0]:  # a batch head: re-ranked when it ages
            heapq.heappush(self._aging, (candidate.head().ages_at, stamp, candidate))

    def _age(self, now: float) -> None:
        while self._aging and self._aging[0][0] <= now:
            _, stamp, candidate = heapq.heappop(self._aging)
            self.work += 1
            if candidate.stamp == stamp:  # still parked with that head
                place = candidate.place
                self._push(candidate, place, candidate.head().order(now))
                if place:
                    self._woken.add(place)

    def queued(self) -> list[str]:
        return list(self._waiters)

    def queued_counts(self) -> dict[str, int]:
        """Shared resource -> waiters that need it (from the order statistics)."""
        counts: dict[str, int] = {}
        for (resource, _), ranks in self._ranks.items():
            if resource and ranks.total:
                counts[resource] = counts.get(resource, 0) + ranks.total
        return counts


def _first_full(
    resources: tuple[str, ...],
    held: MutableMapping[str, int],
    limit_of: Callable[[str], int],
    *,
    private: bool,
) -> str | None:
    """The first full resource of the kind asked; a Space before ``backend:global``, so
    that a lane blocked by both waits under its Space (fewer waiters to wake)."""
    found: str | None = None
    for r in resources:
        if is_private(r) == private and held.get(r, 0) >= limit_of(r):
            if not r.startswith("backend:"):
                return r
            found = r
    return found
