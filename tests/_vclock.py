"""A virtual clock for tests: cool-downs, wake deadlines and backoffs pass without waiting.

Design. Virtual time is real time plus an offset that only grows::

    now()  = time.monotonic() + skipped
    wall() = time.time()      + skipped

so it never runs slower than real time: real work (a gradio call in a worker thread,
a Space answering, a round trip to Redis) takes at least its real duration in virtual
time, and a deadline around it cannot run out early. Virtual time runs *faster* only by
jumps, and a jump always lands on the wake-up time of the earliest pending ``sleep``:

* **autojump**: once no ``sleep``/``timeout`` of this clock has started or ended for
  ``quiet_s`` real seconds (the loop has nothing else to do for the clock's users) and
  no *hold* is in place, the clock jumps to the earliest wake-up and wakes that sleeper;
* **advance**: ``await clock.advance(s)`` walks virtual time forward by ``s``, waking
  sleepers in order of wake-up on the way (a test passing a cool-down on purpose).

A *hold* is in place while any ``timeout()`` block of this clock is open — the pool
puts every wait of the request path on a Space inside one (a predict, a connect, the
probe of a waking Space, a release; ``timeout(None)`` when unbounded, see
``pool/_clock.py``) — and while a test's ``with clock.hold():`` block is open. While
held, virtual time runs at real speed only, so a real call can never appear to take
less than it did, nor have its deadline skipped past while it is in flight. Sleeps
with nothing real going on — backoffs, wake polling, upkeep ticks — pass at once.

``timeout()`` is on the same time line as ``sleep()``: it is ``asyncio.timeout`` whose
expiry moves earlier by every jump (only ``advance`` can jump while one is open), so a
5 s sleep and a 5 s timeout started together end together.

Limits: waits outside any hold — admission in the store, the upkeep's background I/O
(health probes, connections opened to top up), a test's own real ``asyncio.sleep`` —
may see the clock jump to the next sleeper meanwhile; so may real work a test does
without ``hold()``. Only sleepers are affected (they wake earlier in real time).

Deterministic: jumps only ever land on a sleeper's own wake-up time, earliest first
(ties in the order the sleeps began), so the order in which the pool's sleepers wake
does not depend on machine load; what load changes is only the real time spent in real
work between wake-ups.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType

from pool import Clock


@dataclass(order=True)
class _Sleeper:
    at: float  # virtual wake-up time
    seq: int
    future: asyncio.Future[None] = field(compare=False)
    handle: asyncio.TimerHandle | None = field(default=None, compare=False)


class VirtualClock(Clock):
    """Real time plus jumps to the next sleeper's wake-up (see the module docstring)."""

    def __init__(self, *, autojump: bool = True, quiet_s: float = 0.002) -> None:
        self.skipped = 0.0  # virtual seconds jumped over so far
        self.jumps = 0
        self._autojump = autojump
        self._quiet_s = quiet_s
        self._sleepers: list[_Sleeper] = []  # a heap, earliest first
        self._seq = itertools.count()
        self._timeouts: set[asyncio.Timeout] = set()
        self._holds = 0
        self._tick: asyncio.TimerHandle | None = None

    # -- the Clock interface ------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() + self.skipped

    def wall(self) -> float:
        return time.time() + self.skipped

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        sleeper = _Sleeper(self.now() + seconds, next(self._seq), loop.create_future())
        heapq.heappush(self._sleepers, sleeper)
        self._arm(sleeper)
        self._touch()
        try:
            await sleeper.future
        finally:
            if sleeper.handle is not None:
                sleeper.handle.cancel()
            with contextlib.suppress(ValueError):
                self._sleepers.remove(sleeper)
                heapq.heapify(self._sleepers)
            self._touch()

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[object]:
        return _Timeout(self, seconds)

    # -- for tests ----------------------------------------------------------------------
    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """No autojump inside: virtual time runs at real speed (real work in progress)."""
        self._holds += 1
        try:
            yield
        finally:
            self._holds -= 1
            self._touch()

    async def advance(self, seconds: float) -> None:
        """Move virtual time forward by ``seconds``, waking sleepers due on the way in
        order (each gets a few loop turns to run before the next jump)."""
        target = self.now() + seconds
        while self._sleepers and self._sleepers[0].at <= target:
            self._jump_to(self._sleepers[0].at)
            await _turns()
        self._jump_to(target)
        await _turns()

    @property
    def sleepers(self) -> int:
        """Sleeps pending now."""
        return len(self._sleepers)

    # -- machinery ----------------------------------------------------------------------
    def _arm(self, sleeper: _Sleeper) -> None:
        """(Re)schedule ``sleeper``'s wake-up in real time from the virtual one."""
        if sleeper.handle is not None:
            sleeper.handle.cancel()
        loop = sleeper.future.get_loop()
        sleeper.handle = loop.call_later(max(0.0, sleeper.at - self.now()), _wake, sleeper)

    def _jump_to(self, at: float) -> None:
        """Skip virtual time forward to ``at`` (no-op if already there)."""
        skip = at - self.now()
        if skip <= 0:
            return
        self.skipped += skip
        self.jumps += 1
        for sleeper in self._sleepers:
            if sleeper.at <= at:
                _wake(sleeper)
            else:
                self._arm(sleeper)
        for timeout in self._timeouts:
            when = timeout.when()
            if when is not None and not timeout.expired():
                timeout.reschedule(when - skip)

    def _touch(self) -> None:
        """Something on this clock started or ended: autojump only after a quiet spell."""
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if not (self._autojump and self._sleepers):
            return
        loop = self._sleepers[0].future.get_loop()
        if not loop.is_closed():
            self._tick = loop.call_later(self._quiet_s, self._quiet)

    def _quiet(self) -> None:
        self._tick = None
        if self._holds or not self._sleepers:
            self._touch()  # look again after another quiet spell
            return
        self._jump_to(self._sleepers[0].at)
        self._touch()


def _wake(sleeper: _Sleeper) -> None:
    if not sleeper.future.done():
        sleeper.future.set_result(None)


async def _turns(count: int = 10) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


class _Timeout:
    """``asyncio.timeout`` on a :class:`VirtualClock`'s time line; holds autojump."""

    def __init__(self, clock: VirtualClock, seconds: float | None) -> None:
        self._clock = clock
        self._inner = asyncio.timeout(None if seconds is None else max(0.0, seconds))

    async def __aenter__(self) -> asyncio.Timeout:
        clock = self._clock
        clock._holds += 1
        try:
            await self._inner.__aenter__()
        except BaseException:
            clock._holds -= 1
            raise
        clock._timeouts.add(self._inner)
        clock._touch()
        return self._inner

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        clock = self._clock
        clock._timeouts.discard(self._inner)
        clock._holds -= 1
        clock._touch()
        await self._inner.__aexit__(exc_type, exc, tb)
