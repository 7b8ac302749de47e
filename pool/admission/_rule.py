"""The grant rule shared by every coordinator store.

A request needs one slot of each of its resources, all at once. Resources come in
two classes:

* **shared** resources (``backend:global``, ``space:<name>``) that many consumers
  compete for, and
* **private** resources (``consumer:<hash>``) that only one consumer's requests use.

The rule, applied to the waiters in arrival order, with a set ``reserved`` of
shared resources that starts empty::

    for w in waiters (oldest first):
        if any private resource of w is full:      skip w          (1)
        short = shared resources of w that are full
        if short or (shared(w) & reserved):        reserved |= short; skip w   (2)
        else:                                      grant w                     (3)

Why:

* (1) a request held back only by its own consumer limit reserves nothing, so a
  heavy user's backlog never delays another user's request (no monopoly, SPEC 4.5
  property 3). It keeps its arrival position for when its own slot frees.
* (2) a waiter that cannot be served reserves the shared resources it is short of.
  A later waiter may not take a slot of a reserved resource, so nobody overtakes an
  earlier waiter on a resource that earlier waiter is waiting for (FIFO, property 4).
  Because a reservation only covers resources that are actually full, a free slot of
  some *other* resource still goes to whoever can use it (work-conserving, property 5).
* (3) grants are all-or-nothing (property 2) and never exceed a limit (property 1):
  ``held`` is updated as grants are made within one pass.

There is no starvation: the oldest waiter that is not consumer-blocked reserves every
shared resource it is short of, so each of those is handed to it as soon as it frees.

The function is pure and has no ``await``: the memory and SQLite stores call it inside
their critical section; the Redis store runs the same rule in a Lua script
(:mod:`pool.admission._redis`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

CONSUMER_PREFIX = "consumer:"
GLOBAL_RESOURCE = "backend:global"
SPACE_PREFIX = "space:"

K = TypeVar("K", bound=Hashable)


def is_private(resource: str) -> bool:
    """True for resources used by one consumer only."""
    return resource.startswith(CONSUMER_PREFIX)


def plan_grants(
    waiters: Iterable[tuple[K, Sequence[str]]],
    held: Mapping[str, int],
    limit_of: Callable[[str], int],
) -> list[K]:
    """Return the keys of the waiters to grant now, oldest first (see module doc)."""
    counts = dict(held)
    reserved: set[str] = set()
    granted: list[K] = []
    for key, resources in waiters:
        if any(
            is_private(r) and counts.get(r, 0) >= limit_of(r) for r in resources
        ):
            continue
        shared = [r for r in resources if not is_private(r)]
        short = {r for r in shared if counts.get(r, 0) >= limit_of(r)}
        if short or not reserved.isdisjoint(shared):
            reserved |= short
            continue
        for r in resources:
            counts[r] = counts.get(r, 0) + 1
        granted.append(key)
    return granted


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
