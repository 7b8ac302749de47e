"""The grant rule shared by every coordinator store.

A request needs one slot of each of its resources, all at once. Resources come in
two classes:

* **shared** resources (``backend:global``, ``space:<name>``) that many consumers
  compete for, and
* **private** resources (``consumer:<hash>``) that only one consumer's requests use.

The rule, applied to the waiters in arrival order, over counts that start as the
slots held::

    for w in waiters (oldest first):
        if any private resource of w is full:      skip w                          (1)
        elif every resource of w has a free slot:  grant w; count its slots        (2)
        else:                                      count one slot of each shared
                                                   resource of w as taken; skip w  (3)

Why:

* (1) a request held back only by its own consumer limit takes no place in line on
  the shared resources, so a heavy user's backlog never delays another user's
  request (no monopoly, SPEC 4.5 property 3). It keeps its arrival position for when
  its own slot frees.
* (3) a waiter that cannot be served yet *holds its place*: one slot of each shared
  resource it needs is set aside for it in this pass. A later waiter gets a slot of a
  shared resource only if one is left beyond what every earlier waiter needs, so
  nobody is overtaken on a Space or on the global resource (FIFO, property 4) and the
  oldest waiter is served as soon as its resources free up (no starvation).
* (2) grants are all-or-nothing (property 2) and never exceed a limit (property 1):
  counts grow as grants are made within one pass. A slot stays idle only while an
  earlier waiter has a claim on it — the work-conserving bound that property 5 allows
  ("without breaking 4").

The price of strict FIFO is head-of-line blocking: a waiter for a full Space sets
aside a global slot that a request for another Space could have used. The pool keeps
that cheap by routing users to the least-loaded Space and by the per-Space window.

The function is pure and has no ``await``: the memory and SQLite stores call it inside
their critical section; the Redis store runs the same rule in a Lua script
(:mod:`pool.admission._redis`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
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
    *,
    all_need: str | None = None,
) -> list[K]:
    """Return the keys of the waiters to grant now, oldest first (see module doc).

    The rule's pass is repeated over the waiters left until it grants nothing new: a
    grant late in a pass can fill the consumer of an earlier waiter that held a place
    in line at (3); that waiter can no longer be served now, so the next pass skips it
    at (1) and its place goes to whoever can use it (else a slot would stay idle while
    a waiter could take it, SPEC 4.5 property 5). Each pass applies the rule to the
    state the last one left, so the result keeps every property of one pass.

    ``all_need`` is a resource that the caller knows *every* waiter needs (the pool's
    requests all need ``backend:global``). Once its count — held, granted in this pass
    and set aside by (3) — reaches its limit, no later waiter can be granted and
    nothing later can change what the pass returns, so the pass stops there: a
    hand-off costs O(limit), not O(waiters), however long the queue. ``waiters`` may
    be a lazy iterable; it is read once, not past the furthest point a pass reaches.
    """
    source = iter(waiters)
    read: list[tuple[K, Sequence[str]]] = []

    def queue() -> Iterator[tuple[K, Sequence[str]]]:
        yield from read
        for item in source:
            read.append(item)
            yield item

    base = dict(held)
    granted: list[K] = []
    while True:
        new, stale = _one_pass(queue(), base, limit_of, all_need, set(granted))
        granted.extend(new)
        if not stale:
            return granted
        fresh = set(new)
        for key, resources in read:
            if key in fresh:
                for r in resources:
                    base[r] = base.get(r, 0) + 1


def _one_pass(
    waiters: Iterable[tuple[K, Sequence[str]]],
    held: Mapping[str, int],
    limit_of: Callable[[str], int],
    all_need: str | None,
    done: set[K],
) -> tuple[list[K], bool]:
    """One pass of the rule over the waiters not in ``done``: (the keys it grants,
    whether a place held at (3) went stale, i.e. its consumer filled up later on)."""
    counts = dict(held)
    granted: list[K] = []
    claims: list[Sequence[str]] = []  # resources of the waiters holding a place
    full_at = UNLIMITED if all_need is None else limit_of(all_need)
    for key, resources in waiters:
        if key in done:
            continue
        if all_need is not None and counts.get(all_need, 0) >= full_at:
            break
        if any(is_private(r) and counts.get(r, 0) >= limit_of(r) for r in resources):
            continue
        if all(counts.get(r, 0) < limit_of(r) for r in resources):
            for r in resources:
                counts[r] = counts.get(r, 0) + 1
            granted.append(key)
        else:
            claims.append(resources)
            for r in resources:
                if not is_private(r):
                    counts[r] = counts.get(r, 0) + 1
    stale = any(
        is_private(r) and counts.get(r, 0) >= limit_of(r) for res in claims for r in res
    )
    return granted, stale and bool(granted)


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
