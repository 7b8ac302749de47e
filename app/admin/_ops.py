"""Operations: liveness (``/healthz``), readiness (``/readyz``), the index, Prometheus
(``/metrics``) and the pool's statistics for the admin (``/api/admin/pool-stats``)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from pool import get_pool

from ..core import metrics as _metrics
from ..core import services_of
from ..edge import ERROR_RESPONSES, is_admin, require_admin_token
from ..jobs import JobRunner
from ._history import Activity
from ._readiness import Readiness

_log = logging.getLogger("spacepool.app")

router = APIRouter()
admin = APIRouter(dependencies=[Depends(require_admin_token)])


@router.get("/healthz", tags=["service"])
async def healthz() -> dict[str, str]:
    """Liveness: the process answers. Does not contact any Space (``/readyz`` does)."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    tags=["service"],
    responses={503: {"description": "not ready: the coordinator or an app's every Space"}},
)
async def readyz(request: Request) -> JSONResponse:
    """Readiness: the admission store answers and every app has a Space up or wakeable
    (app/admin/_readiness.py). 503 otherwise, saying what failed."""
    readiness = services_of(request).get(Readiness)
    ready, body = await readiness.check(get_pool())
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/", tags=["service"], include_in_schema=False)
async def index() -> dict[str, Any]:
    """Where to go from here."""
    return {
        "service": "spacepool",
        "docs": "/docs",
        "endpoints": [
            "/api/predict",
            "/api/jobs",
            "/api/spaces",
            "/api/sessions",
            "/api/admin/pool-stats",
            "/metrics",
        ],
    }


@admin.get("/api/admin/pool-stats", responses=ERROR_RESPONSES, tags=["admin"])
async def pool_stats(request: Request) -> dict[str, Any]:
    """The pool's statistics (SPEC 5 keys, plus admission and the dashboard's activity)."""
    pool = get_pool()
    stats: dict[str, Any] = await pool.stats()
    activity = services_of(request).find(Activity)
    if activity is not None:  # app.admin._history: requests per minute, errors, queue history
        await activity.extend(stats, pool.coordinator if stats.get("initialized") else None)
    return stats


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text"}},
    tags=["service"],
)
async def metrics(request: Request) -> Response:
    """Prometheus exposition: hook-fed counters plus gauges read from pool stats now."""
    try:
        stats: dict[str, Any] = await get_pool().stats()
    except Exception:
        _log.warning("pool stats unavailable for /metrics", exc_info=True)
        stats = {}
    jobs = await services_of(request).get(JobRunner).store.counts()
    text = _metrics.render(stats, jobs, teams=is_admin(request))  # per-key: the admin's
    return Response(text, media_type=_metrics.CONTENT_TYPE)


router.include_router(admin)
