"""One queue join at a time to a Space whose own queue is tight (issue 31); how many of
our calls are at the Space.

Gradio refuses a join ("Queue is full") when the events *waiting* in the Space's queue
reach ``max_size`` (``gradio/queueing.py`` ``push``), and an event leaves that queue
only when the Space's dispatch loop starts it, which polls every ``sleep_when_free``.
With ``max_size=1`` (the ZeroGPU default) two joins that arrive within one poll are one
too many even with every worker free: two of our calls that end together and hand
their slots to two waiters at once get one of them refused — a race, not the Space's
limit. Once a Space has refused a join, its joins are paced: the next is sent when the
previous one has started (``process_starts``), ended, or :data:`TURN_S` passed.

How many of our calls ran at the Space at once is counted from the Space's own messages
(issue 31): a call runs there from its ``process_starts`` to its ``process_completed``,
not from our join to our end of it. The Space sends an event's ``process_completed``
before it frees that worker and dispatches the next (``gradio/queueing.py``
``process_events``: the message, then ``current_concurrency -= 1`` in its ``finally``;
``start_processing`` then sends the next event's ``process_starts``), but each session
has a stream of its own, and two streams' messages may reach us in either order: a call
counts beside one that started after it only if it was still running :data:`GRACE_S`
after that start (a count that may read low, never high, as a floor needs).

A call that waited for a worker or was refused says the opposite: the Space runs fewer
than the calls of ours it held then. That is counted from our side, the most of our
calls sent and not ended at any moment from its join to its start (or its end): a join
sent after another may reach the Space first, so the count when it was sent can read
low; this one may read high, never low, as a cap needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ..transport import SpaceCall, UpstreamDone, UpstreamStarted

TURN_S = 1.0  # the longest a join waits for the previous one to start
GRACE_S = 0.05  # two streams' messages may cross by this much (see the module docstring)


@dataclass
class _Ours:
    """One of our calls at the Space: when its end reached us (monotonic)."""

    call: SpaceCall
    peak: int  # the most of our calls sent and not ended, from its join to its start
    ended: float | None = None


class JoinPacer:
    """The joins of one Space; :attr:`tight` once its queue refused one."""

    def __init__(self) -> None:
        self.tight = False
        self.running = 0  # our calls sent to the Space and not ended
        self._lock = asyncio.Lock()
        # The last join sent: the first paced one waits for it too (sent before the
        # Space refused one, it may still sit in the Space's queue: two joins within one
        # of its polls are the race pacing is for).
        self._last: SpaceCall | None = None
        self._ours: list[_Ours] = []  # running, or ended but counted beside a running one
        # What each ended call counted: (peak, ran_with), kept while the call lives.
        self._counts: weakref.WeakKeyDictionary[SpaceCall, tuple[int, int]] = (
            weakref.WeakKeyDictionary()
        )

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Send a join inside: once the previous one started, if the Space is tight
        (:meth:`joined` names the call sent)."""
        if not self.tight:
            yield
            return
        async with self._lock:
            if self._last is not None:
                await _started(self._last)
                self._last = None
            yield

    def joined(self, call: SpaceCall) -> int:
        """``call`` was just submitted (the next join waits for it to start, if the
        Space is tight); returns our calls at the Space now, ``call`` included — what
        the Space's answers about its queue are measured by (pool/resilience/_health.py)."""
        self._last = call
        self.running += 1
        for other in self._ours:
            if other.ended is None and other.call.started_at is None:
                other.peak = max(other.peak, self.running)
        ours = _Ours(call, self.running)
        self._ours.append(ours)
        call.result.add_done_callback(lambda _: self._ended(ours))
        return self.running

    def ran_with(self, call: SpaceCall) -> int:
        """How many of our calls ran at the Space when ``call`` started there, itself
        included, from the Space's own start and completion messages (0: not known)."""
        return self._counts.get(call, (0, 0))[1]

    def held_with(self, call: SpaceCall) -> int:
        """The most of our calls sent to the Space and not ended at any moment from
        ``call``'s join to its start (or end), itself included (0: not known)."""
        return self._counts.get(call, (0, 0))[0]

    def _ended(self, ours: _Ours) -> None:
        self.running -= 1
        ours.ended = time.monotonic()
        start = ours.call.started_at
        ran_with = 0 if start is None else 1 + sum(
            1 for other in self._ours
            if other is not ours and (began := other.call.started_at) is not None
            and began <= start and (other.ended is None or other.ended > start + GRACE_S)
        )  # fmt: skip
        self._counts[ours.call] = (ours.peak, ran_with)
        # An ended call counts for none that started after it ended (+ the grace).
        starts = [o.call.started_at for o in self._ours if o.ended is None]
        oldest = min((s for s in starts if s is not None), default=math.inf)
        self._ours = [o for o in self._ours if o.ended is None or o.ended > oldest + GRACE_S]


async def _started(call: SpaceCall) -> None:
    """Return once ``call`` started at the Space or ended (bounded by :data:`TURN_S`)."""
    seen = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(TURN_S):
            while not call.result.done() and call.started_at is None:
                first, events = call.events.since(seen)
                if any(isinstance(e, UpstreamStarted | UpstreamDone) for e in events):
                    return
                if call.events.closed:
                    return
                seen = first + len(events)
                await call.events.wait(seen)
