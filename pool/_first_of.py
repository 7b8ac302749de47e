"""One waiter queued for several Spaces at once (late binding, issue 31), and the pin
its user gets from the first of their calls to be admitted (issue 37).

The waiter holds one place per Space, all with the same class and arrival, so an app's
replicas serve one queue. The first grant wins — the best Space among those granted in
one hand-off — and every other place is given up; a grant that came at the same moment
goes back to the store, which hands it to the next waiter.

For a user not pinned yet, a grant is kept only once the user's pin is claimed for its
Space (:meth:`Choice.claim <pool.routing._choice.Choice.claim>`, one compare-and-set in
the coordinator's shared values). When another call of the user — in this process or
another — was admitted first, the pin names that Space: the grant goes back and this
waiter keeps only its place there, which it has held since it arrived, so nobody who
came later passes it. The waiter also watches the pin, so that it gives up its other
places as soon as the pin is made, not only when one of them is granted. A pin naming a
Space this waiter did not queue for (it was not able to start the call when the waiter
was routed) sends it back to routing (:class:`Repinned`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from .admission import GLOBAL_RESOURCE, SPACE_PREFIX, Changed, Coordinator, Lease, WaitTicket
from .connections import SpacePool
from .routing import Choice, Route

Detached = Callable[[Coroutine[Any, Any, Any]], Awaitable[object]]


class Repinned(Exception):
    """The user's pin names a Space this waiter holds no place on: route again."""


def granted(wait: asyncio.Future[Lease]) -> bool:
    return wait.done() and not wait.cancelled() and wait.exception() is None


class FirstOf:
    """One waiter's places on several Spaces (see the module docstring)."""

    def __init__(
        self, *, coordinator: Coordinator, choice: Choice, detached: Detached,
        sps: Sequence[SpacePool], consumers: Sequence[str], route: Route | None,
    ) -> None:  # fmt: skip
        """``route``: the user's, when the first grant must claim their pin; None for
        an anonymous caller (late binding, no pin)."""
        self._coordinator = coordinator
        self._choice = choice
        self._detached = detached
        self._sps = {sp.name: sp for sp in sps}
        self._consumers = list(consumers)
        self._route = route
        self._waits: dict[str, asyncio.Future[Lease]] = {}  # Space -> its place, best first

    async def run(self, timeout: float, ticket: WaitTicket | None) -> tuple[Lease, SpacePool]:
        parts = (ticket or WaitTicket()).parts(len(self._sps))
        for name, part in zip(self._sps, parts, strict=True):
            resources = [GLOBAL_RESOURCE, SPACE_PREFIX + name, *self._consumers]
            self._waits[name] = asyncio.ensure_future(
                self._coordinator.acquire(resources, timeout=timeout, ticket=part)
            )
        chosen: str | None = None
        try:
            watch = (
                self._choice.watch_pin(self._route)
                if self._route is not None
                else contextlib.nullcontext(None)
            )
            async with watch as changed:
                while chosen is None:
                    chosen = await self._next(changed)
        finally:  # in a task of its own: a second cancel must not leave a grant held
            await self._detached(self._give_up(keep=chosen))
        return self._waits[chosen].result(), self._sps[chosen]

    async def _next(self, changed: Changed | None) -> str | None:
        """Wait for a grant (or a change of the pin); the Space won, else None."""
        watcher = None if changed is None else asyncio.ensure_future(changed.wait())
        try:
            waits: list[asyncio.Future[Any]] = list(self._waits.values())  # done: at once
            await asyncio.wait(
                [*waits, *([watcher] if watcher else [])], return_when=asyncio.FIRST_COMPLETED
            )
            await asyncio.sleep(0)  # the grants of the same hand-off
        finally:
            if watcher is not None:
                watcher.cancel()
        won = [name for name, wait in self._waits.items() if granted(wait)]
        if not won:
            failed = next((w for w in self._waits.values() if w.done()), None)
            if failed is not None:
                await failed  # its error (the wait timed out, the queue is full, ...)
            if self._route is not None and watcher is not None and watcher.done():
                await self._follow(await self._choice.pin_of(self._route))
            return None
        if self._route is None:
            return won[0]
        holder = await self._choice.claim(self._route, won[0])
        if holder in won:
            return holder
        await self._follow(holder)
        return None

    async def _follow(self, holder: str | None) -> None:
        """The user is pinned to ``holder``: keep only that place (Repinned when this
        waiter holds none there)."""
        if holder is None or set(self._waits) == {holder}:
            return
        if holder not in self._waits:
            raise Repinned(holder)
        await self._detached(self._give_up(keep=holder))
        self._waits = {holder: self._waits[holder]}

    async def _give_up(self, keep: str | None) -> None:
        """Stop every wait but ``keep``'s; return the grants it will not use."""
        others = [w for name, w in self._waits.items() if name != keep]
        for wait in others:
            wait.cancel()
        if others:
            await asyncio.gather(*others, return_exceptions=True)
        for wait in others:
            if granted(wait):
                await self._coordinator.release(wait.result())
