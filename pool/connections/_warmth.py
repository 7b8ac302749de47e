"""Connections kept warm ahead of demand (docs/scheduling.md, "Warm-up").

The rule, per Space and per process: above the minimum, keep open the highest number
of connections *in use* seen over the last ``POOL_WARM_WINDOW_S`` (bounded by the
maximum)::

    kept_warm = min(max_connections, max(min_connections, peak in use over the window))

The reaper closes idle connections only down to ``kept_warm``, so a burst that recurs
within the window finds its connections open instead of paying connection set-up at
the worst moment. Once a peak is older than the window it no longer counts, and the
connections it justified are reaped after ``POOL_IDLE_TIMEOUT_S`` as before (decay).

Each :class:`~pool.connections._space_pool.SpacePool` records the peak in use since it was last
asked (:meth:`~pool.connections._space_pool.SpacePool.take_peak_in_use`); :class:`Warmth` keeps
those per-tick peaks as a monotonic queue (a later, higher peak makes earlier, lower
ones irrelevant), so its memory is bounded by the distinct falling peaks, not by time.

``POOL_WARMUP=true`` also opens each Space's minimum in the background at start
(:meth:`Warmth.warm_up`); otherwise the first request does.
"""

from __future__ import annotations

import logging
from collections import deque

from .._clock import Clock
from ._space_pool import SpacePool

_log = logging.getLogger("spacepool")


class Warmth:
    """The kept-warm figure of every Space of one process (see the module doc)."""

    def __init__(self, window_s: float, clock: Clock) -> None:
        self._window_s = window_s
        self._clock = clock
        self._peaks: dict[str, deque[tuple[float, int]]] = {}

    def keep(self, sp: SpacePool) -> int:
        """Record ``sp``'s peak in use since the last call; return how many connections
        it keeps open now (stored on ``sp.kept_warm`` for the stats)."""
        now = self._clock.now()
        peak = sp.take_peak_in_use()
        peaks = self._peaks.setdefault(sp.name, deque())
        while peaks and peaks[-1][1] <= peak:
            peaks.pop()  # a later, higher (or equal) peak outlives it
        peaks.append((now, peak))
        while peaks[0][0] < now - self._window_s:
            peaks.popleft()
        kept = min(sp.max_size, max(sp.min_size, peaks[0][1]))
        sp.kept_warm = kept
        return kept

    @staticmethod
    def warm_up(spaces: dict[str, SpacePool]) -> None:
        """``POOL_WARMUP``: open each Space's minimum now, in the background."""
        for sp in spaces.values():
            _log.info("warm-up: opening %d connection(s) to %s", sp.min_size, sp.name)
            sp.warm_up()
