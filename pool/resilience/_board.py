"""The health board: every Space's shared :class:`SpaceHealth`, cached in this process.

Writes go through ``SharedValues.update`` (atomic in every store), so the window
and the breaker are one per Space for the whole fleet; reads on the request path use
the local cache, which every write of ours and a refresh every maintenance tick keep
current (another process's change is seen within one tick).

The window *is* the Space's admission limit: after a change the board sets
``space:<name>`` in the coordinator at once. Two processes changing the window at the
same moment may set their limits out of order; the refresh re-applies the stored
window every tick, so the limit converges within one tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .._clock import SYSTEM_CLOCK, Clock
from .._events import Hook, PoolEvent, emit
from ..admission import SPACE_PREFIX, Coordinator
from ._health import HealthParams, Outcome, SpaceHealth, record, take_probe

_log = logging.getLogger("spacepool")
KEY_PREFIX = "health:"
_TTL_S = 7 * 24 * 3600.0  # refreshed by every write; an unused record resets after a week


class HealthBoard:
    """Shared health records of the configured Spaces."""

    def __init__(
        self,
        coordinator: Coordinator,
        names: list[str],
        params: HealthParams,
        hooks: list[Hook],
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._coordinator = coordinator
        self.params = params
        self._hooks = hooks
        self._clock = clock
        now = clock.wall()
        self._cache = {name: SpaceHealth.loads(None, params, now) for name in names}
        self._applied: dict[str, int] = {}

    # -- reads (local, no I/O) ------------------------------------------------------------
    def get(self, name: str) -> SpaceHealth:
        return self._cache[name]

    def now(self) -> float:
        return self._clock.wall()

    # -- writes -----------------------------------------------------------------------------
    async def update(
        self, name: str, change: Callable[[SpaceHealth, float], SpaceHealth | None]
    ) -> SpaceHealth:
        """Apply ``change`` atomically to the stored record; returns the record after."""
        params = self.params
        before: list[SpaceHealth] = []

        def step(raw: str | None) -> str | None:
            now = self._clock.wall()
            current = SpaceHealth.loads(raw, params, now)
            before[:] = [current]
            new = change(current, now)
            if new is None or (new == current and raw is not None):
                return None
            return new.dumps()

        raw = await self._coordinator.values.update(KEY_PREFIX + name, step, _TTL_S)
        after = SpaceHealth.loads(raw, params, self._clock.wall())
        self._learn(name, after, before[0] if before else self._cache[name])
        await self._apply_limit(name, after.window)
        return after

    async def record(self, name: str, outcome: Outcome, at: int = 0) -> SpaceHealth:
        """Feed one outcome (``at``: our calls at the Space when it was sent, 0: not
        known; pool/resilience/_health.py)."""
        params = self.params
        return await self.update(name, lambda h, now: record(h, outcome, now, params, at))

    async def take_probe(self, name: str) -> bool:
        """Become the half-open probe of ``name``; False if someone else is (or no probe
        is due)."""
        params = self.params
        got: list[bool] = []

        def change(h: SpaceHealth, now: float) -> SpaceHealth | None:
            new = take_probe(h, now, params)
            got[:] = [new is not None]
            return new

        await self.update(name, change)
        return bool(got and got[0])

    async def start(self) -> None:
        """Create missing records and make every Space's limit its window."""
        for name in self._cache:
            await self.update(name, lambda h, _now: h)

    async def refresh(self) -> None:
        """Read every record (other processes' changes) and re-apply the windows."""
        stored = await self._coordinator.values.scan(KEY_PREFIX)
        now = self._clock.wall()
        for name in self._cache:
            raw = stored.get(KEY_PREFIX + name)
            if raw is not None:
                # Not announced: the process that made the change reports it.
                self._cache[name] = SpaceHealth.loads(raw, self.params, now)
        limits = {SPACE_PREFIX + n: h.window for n, h in self._cache.items()}
        await self._coordinator.set_limits(limits)
        self._applied = {n: h.window for n, h in self._cache.items()}

    # -- internals -----------------------------------------------------------------------------
    def _learn(self, name: str, after: SpaceHealth, before: SpaceHealth) -> None:
        self._cache[name] = after
        if after.window != before.window:
            direction = "increase" if after.window > before.window else "decrease"
            emit(self._hooks, PoolEvent("window", name, direction, value=after.window))
        if after.breaker != before.breaker:
            _log.warning("space %s breaker %s -> %s", name, before.breaker, after.breaker)
            emit(self._hooks, PoolEvent("breaker", name, after.breaker))

    async def _apply_limit(self, name: str, window: int) -> None:
        if self._applied.get(name) != window:
            await self._coordinator.set_limits({SPACE_PREFIX + name: window})
            self._applied[name] = window
