"""Changes to shared values, signalled: a watcher awaits a key's next write, it does
not poll the key.

Each store delivers the fleet's writes in ONE place per process and wakes the
watchers through one :class:`Watchers`:

* memory: the write itself wakes them (there is one process);
* Redis: ``values.lua`` PUBLISHes each written key on ``<prefix>changed``; one
  subscriber per process, started by the first watcher, wakes that key's watchers,
  and every watcher after it (re)subscribes, as a message may have been lost while
  it was away (:mod:`pool.admission._redis_values`);
* SQLite: no push channel, so one loop per process, running while anybody watches,
  reads the watched keys and wakes those whose value changed; this process's own
  writes wake at once (:mod:`pool.admission._sqlite_values`).

A wake-up is level-triggered (a write between two waits is not lost) and may be
spurious (a reconnect, a key seen for the first time): a watcher watches *before* it
reads the value, and reads it again after each wake-up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable


class Changed:
    """One watcher's wake-ups for one key."""

    __slots__ = ("_event", "key")

    def __init__(self, key: str) -> None:
        self.key = key
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout: float | None = None) -> bool:
        """True when the key may have been written since the last wait (or since the
        watch began); False when ``timeout`` passed first."""
        if not self._event.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await self._event.wait()
            except TimeoutError:
                return False
        self._event.clear()
        return True


class Watchers:
    """This process's watchers, by key; the store's one listener wakes them.

    ``ready`` (a store's) is awaited by each new watch: it starts the listener if it
    is not running and returns once changes made from then on will be delivered.
    """

    def __init__(self, ready: Callable[[], Awaitable[None]] | None = None) -> None:
        self._ready = ready
        self._by_key: dict[str, set[Changed]] = {}

    @contextlib.asynccontextmanager
    async def watch(self, key: str) -> AsyncIterator[Changed]:
        changed = Changed(key)
        self._by_key.setdefault(key, set()).add(changed)
        try:
            if self._ready is not None:
                await self._ready()
            yield changed
        finally:
            found = self._by_key.get(key)
            if found is not None:
                found.discard(changed)
                if not found:
                    del self._by_key[key]

    def keys(self) -> list[str]:
        """The keys somebody watches now."""
        return list(self._by_key)

    def notify(self, key: str) -> None:
        for changed in self._by_key.get(key, ()):
            changed.set()

    def notify_all(self) -> None:
        """Wake every watcher (changes may have been missed: a reconnect)."""
        for found in self._by_key.values():
            for changed in found:
                changed.set()
