"""Resilience: adaptive window, circuit breaker, retries, sleeping Spaces, idle pause.

* :mod:`._health` — the shared per-Space record and its pure transitions;
* :mod:`._board` — that record for every Space, shared through the coordinator;
* :mod:`._retry` — the one retry policy;
* :mod:`._control` — ``SpaceControl`` over the Hub, and a fake;
* :mod:`._waking` — waking on demand within a deadline, pausing idle Spaces;
* :mod:`._capacity` — the host's resource cap on the window.
"""

from __future__ import annotations

from .._retry import RetryPolicy  # a ground module: admission backs off by it too
from ._board import HealthBoard
from ._capacity import ResourceCap, resource_cap
from ._control import WAKING_STAGES, FakeSpaceControl, HubSpaceControl, SpaceControl
from ._health import HealthParams, Outcome, SpaceHealth
from ._waking import WakePolicy, Waker, http_probe

__all__ = [
    "WAKING_STAGES",
    "FakeSpaceControl",
    "HealthBoard",
    "HealthParams",
    "HubSpaceControl",
    "Outcome",
    "ResourceCap",
    "RetryPolicy",
    "SpaceControl",
    "SpaceHealth",
    "WakePolicy",
    "Waker",
    "http_probe",
    "resource_cap",
]
