"""Administration and operations: the probes, ``/metrics`` and pool-stats, the dashboard
and its rolling history, readiness, and the API keys' admin routes (``/api/admin/keys``,
``/usage``)."""

from __future__ import annotations

from ._dashboard import router as dashboard_router
from ._history import Activity, run_sampler
from ._ops import router as ops_router
from ._readiness import Readiness
from ._teams import router as teams_router

__all__ = ["Activity", "Readiness", "dashboard_router", "ops_router", "run_sampler", "teams_router"]
