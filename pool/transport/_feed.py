"""A bounded, append-only feed that wakes its readers the moment an item arrives."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class Feed:
    """The latest ``keep`` items of a stream, numbered from 0, and its end.

    Readers ask for the items from an index on (:meth:`since`; a reader that fell more
    than ``keep`` behind skips older ones, never the latest) and wait for the next one
    with :meth:`wait`. No polling: each append resolves the waiting readers' futures.
    """

    def __init__(self, keep: int) -> None:
        self._items: deque[Any] = deque(maxlen=keep)
        self.total = 0
        self.closed = False
        self._waiters: list[asyncio.Future[None]] = []

    def append(self, item: Any) -> None:
        if self.closed:
            return
        self._items.append(item)
        self.total += 1
        self.poke()

    def close(self) -> None:
        """No more items; readers see the end."""
        self.closed = True
        self.poke()

    def poke(self) -> None:
        """Wake every reader (to look at something else, e.g. a lost lease)."""
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def since(self, index: int) -> tuple[int, list[Any]]:
        """(index of the first returned item, the kept items from ``index`` on)."""
        first = self.total - len(self._items)
        skip = max(0, index - first)
        return first + skip, list(self._items)[skip:]

    async def wait(self, seen: int) -> None:
        """Return once there is an item beyond ``seen``, the feed ended, or a poke."""
        if self.total > seen or self.closed:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)
