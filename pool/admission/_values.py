"""Shared values: small TTL'd strings every process of a fleet reads, kept by namespace.

Beside admission, the fleet shares a few kinds of small state: the health board's
per-Space records (``health:``), each process's published counts (``proc:``), the
service's job mirrors (``job:``) and cancel requests (``jobcancel:``). They live in the
same store as admission (one URL to configure) but apart from it:

* **Not in admission's way.** Admission's script (Redis) and transactions (SQLite)
  never read a value: however many job mirrors a fleet keeps, an acquire costs the
  same. Values have their own small script and table.
* **Read by namespace, through an index.** A key's *namespace* is its text up to and
  including the first ``:`` (``"job:"`` for ``"job:abc"``; ``""`` without a colon).
  :meth:`SharedValues.scan` reads one namespace, never the others: a Redis hash per
  namespace, a ``(ns, key)`` primary key in SQLite. So a sweep of the few
  job index entries does not read ten thousand job mirrors.
* **Expiry is data.** Each value has a deadline on the store's clock; a read never
  returns a value past it, and writes purge the namespace's expired values.

A write anywhere in the fleet wakes this process's watchers of its key
(:meth:`SharedValues.watch`, :mod:`pool.admission._watch`): readers wait for a change,
they do not poll for one.

A store that cannot be reached raises :class:`~pool.admission._protocol.StoreUnavailable`
inside; the coordinator hands its values out wrapped (:class:`GuardedValues`, through
the same guard as its own calls) so that callers see the same
``BusyError(reason="coordinator_unavailable")`` as admission.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol, TypeVar

from ._watch import Changed, Watchers

Update = Callable[[str | None], str | None]
T = TypeVar("T")


def namespace_of(key: str) -> str:
    """``"job:abc"`` → ``"job:"``; a key without ``:`` is in the ``""`` namespace."""
    head, colon, _ = key.partition(":")
    return head + colon if colon else ""


class SharedValues(Protocol):
    """Small values for every process to read, each expiring after its TTL."""

    async def put(self, key: str, value: str, ttl_s: float) -> None:
        """Store ``value`` under ``key`` for ``ttl_s`` seconds."""
        ...

    async def get(self, key: str) -> str | None:
        """The live value under ``key``, or None."""
        ...

    async def scan(self, prefix: str) -> dict[str, str]:
        """Every live value whose key starts with ``prefix``; only ``prefix``'s
        namespace is read (so a prefix should name one: ``"proc:"``)."""
        ...

    async def delete(self, key: str) -> None: ...

    async def update(self, key: str, update: Update, ttl_s: float) -> str | None:
        """Atomically replace the value under ``key`` with ``update(current)``.

        ``update`` is a pure function (no I/O: it may run more than once when another
        process writes the key at the same moment); returning None leaves the value as
        it is. Returns the value stored afterwards (None if there is none).
        """
        ...

    def watch(self, key: str) -> AbstractAsyncContextManager[Changed]:
        """Wake-ups for the writes of ``key`` (put, update, delete) by any process, from
        the moment the context is entered; never raises for an unreachable store."""
        ...


class MemoryValues:
    """One process's values: a dict per namespace."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._spaces: dict[str, dict[str, tuple[str, float]]] = {}
        self._watchers = Watchers()

    def _live(self, namespace: str) -> dict[str, tuple[str, float]]:
        found = self._spaces.setdefault(namespace, {})
        now = self._clock()
        for key in [k for k, (_, expiry) in found.items() if expiry <= now]:
            del found[key]
        return found

    async def put(self, key: str, value: str, ttl_s: float) -> None:
        self._live(namespace_of(key))[key] = (value, self._clock() + ttl_s)
        self._watchers.notify(key)

    async def get(self, key: str) -> str | None:
        found = self._live(namespace_of(key)).get(key)
        return None if found is None else found[0]

    async def scan(self, prefix: str) -> dict[str, str]:
        found = self._live(namespace_of(prefix))
        return {k: v for k, (v, _) in found.items() if k.startswith(prefix)}

    async def delete(self, key: str) -> None:
        self._live(namespace_of(key)).pop(key, None)
        self._watchers.notify(key)

    async def update(self, key: str, update: Update, ttl_s: float) -> str | None:
        current = await self.get(key)  # no await in between: atomic on the loop
        new = update(current)
        if new is None:
            return current
        await self.put(key, new, ttl_s)
        return new

    def watch(self, key: str) -> AbstractAsyncContextManager[Changed]:
        return self._watchers.watch(key)


class Guard(Protocol):
    """Awaits a store call, mapping its unreachability to the coordinator's error."""

    def __call__(self, call: Awaitable[T], /) -> Awaitable[T]: ...


class GuardedValues:
    """A shared store's values, each call through the coordinator's ``guard``."""

    def __init__(self, inner: SharedValues, guard: Guard) -> None:
        self._inner = inner
        self._guard = guard

    async def put(self, key: str, value: str, ttl_s: float) -> None:
        await self._guard(self._inner.put(key, value, ttl_s))

    async def get(self, key: str) -> str | None:
        return await self._guard(self._inner.get(key))

    async def scan(self, prefix: str) -> dict[str, str]:
        return await self._guard(self._inner.scan(prefix))

    async def delete(self, key: str) -> None:
        await self._guard(self._inner.delete(key))

    async def update(self, key: str, update: Update, ttl_s: float) -> str | None:
        return await self._guard(self._inner.update(key, update, ttl_s))

    def watch(self, key: str) -> AbstractAsyncContextManager[Changed]:
        return self._inner.watch(key)
