"""The one failure path: what a failed Space means for routing (SPEC 4.4).

Every failure of a Space goes through :meth:`Failover.space_failed`, which reads the one
table of failure kinds (:mod:`pool._failures`): a provider failure is counted, and a
failure before the call was placed (or one that says the Space is unreachable, or a
429 with its Retry-After) marks the Space down for a cool-down, so that routing goes
round it — unless the Space is booting, when it is waited for instead.

It lives at the connections layer, the lowest that holds all it touches (the Space's
:class:`~pool.connections.SpacePool`, the shared health board below, the pool's hooks),
so that every layer above that meets a failure calls down to it: the request's
attempts (pool/_attempt.py), a leased handle's failed job (:mod:`._handle`) and the
routing layer's discovery of the Spaces' APIs (pool/routing/_apps.py). None of them
hands a callback down to be called back up.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from .._clock import Clock
from .._events import Hook, PoolEvent, emit
from .._exceptions import PoolError, UpstreamTransportError
from .._failures import failure
from ..resilience import HealthBoard
from ..transport import Classified
from ._space_pool import SpacePool

_log = logging.getLogger("spacepool")
SPACE_COOLDOWN_S = 30.0


class Failover:
    """The failure path of a pool's Spaces (see the module docstring)."""

    def __init__(
        self, spaces: Mapping[str, SpacePool], board: HealthBoard, hooks: list[Hook],
        clock: Clock,
    ) -> None:  # fmt: skip
        self._spaces = spaces
        self._board = board
        self._hooks = hooks
        self._clock = clock

    def space_failed(self, sp: SpacePool, error: PoolError, *, placed: bool) -> bool:
        """Count a provider failure; route around ``sp`` for a cool-down when the
        failure came before the call was placed (``placed`` False) or says the Space is
        unreachable, unless it is booting. True when a failover was counted (once per
        failure)."""
        row = failure(error.kind)
        if row.provider:
            emit(self._hooks, PoolEvent("provider_error", sp.name, error.kind))
        waking = self._board.get(sp.name).waking(self._clock.wall())
        # A 429's Retry-After is honoured (a user's QuotaExceeded says nothing of the Space)
        asked = error.retry_after_s if isinstance(error, UpstreamTransportError) else None
        if placed and (not (row.down or asked) or waking):
            return False
        if not waking:
            sp.mark_down(error.kind, asked or SPACE_COOLDOWN_S)
        emit(self._hooks, PoolEvent("failover", sp.name, error.kind))
        others = "; failing over" if len(self._spaces) > 1 else " (the only Space)"
        _log.warning("space %s failed (%s)%s", sp.name, error.kind, others)
        return True

    def job_failed(self, sp: SpacePool, classified: Classified) -> bool:
        """A placed call's failure on ``sp`` (a leased handle's job or relay)."""
        return self.space_failed(sp, classified.error, placed=True)
