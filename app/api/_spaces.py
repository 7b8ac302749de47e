"""Discovery: which Spaces this service fronts, and what each one's API takes.

* ``GET /api/spaces`` — every configured Space with its state, read from
  ``pool.stats()`` (the same figures as pool-stats and the dashboard: up, breaker,
  window, wake, connections, queue), nothing recomputed; and its app: ``apps`` lists
  each app with its replicas (Spaces with identical APIs, or grouped explicitly by
  ``alias@app=URL``; :mod:`pool.routing._apps`) — a Space whose API is not known yet (never
  connected) has ``"app": null``;
* ``GET /api/spaces/{name}/api`` — the Space's endpoints with parameter names, types
  and defaults: ``Client.view_api(return_format="dict")`` of a pooled connection
  (``Pool.endpoints``, cached per Space ``app_id``, so a restarted Space is read again).

Same auth as ``/api/predict``. An unknown name is a 422 ``unknown_space`` naming the
configured ones, as for a predict's ``space``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path

from pool import get_pool

from ..edge import SPACE_PATTERN, require_api_token, to_jsonable

router = APIRouter(dependencies=[Depends(require_api_token)], tags=["spaces"])


def _state(entry: dict[str, Any]) -> str:
    breaker = (entry.get("breaker") or {}).get("state", "closed")
    wake = (entry.get("wake") or {}).get("state")
    if wake in ("waking", "paused", "sleeping"):
        return str(wake)
    if not entry.get("up", True):
        return "down"
    if breaker == "open":
        return "breaker_open"
    return "up"


def _summary(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    window = entry.get("window") or {}
    return {
        "name": name,
        "state": _state(entry),
        "up": entry.get("up"),
        "breaker": (entry.get("breaker") or {}).get("state"),
        "window": window.get("current"),
        "window_ceiling": window.get("ceiling"),
        "wake": (entry.get("wake") or {}).get("state"),
        "connections": {
            "total": entry.get("totalConnections"),
            "available": entry.get("availableConnections"),
            "in_use": entry.get("inUseConnections"),
        },
        "queue_length": entry.get("queueLength"),
        "last_error": entry.get("lastError"),
        "api_url": f"/api/spaces/{name}/api",
    }


@router.get("/api/spaces")
async def list_spaces() -> dict[str, Any]:
    """The configured Spaces, their state (from the pool's statistics) and their apps."""
    pool = get_pool()
    await pool.start()
    await pool.apps.discover(lambda name: pool.board.get(name).admits())
    stats: dict[str, Any] = await pool.stats()
    pools: dict[str, dict[str, Any]] = stats.get("pools", {})
    spaces = [
        {**_summary(name, entry), "app": pool.apps.app_of(name) if name in pool.spaces else None}
        for name, entry in pools.items()
    ]
    apps = [{"app": app, "replicas": names} for app, names in pool.apps.apps().items()]
    return {"spaces": spaces, "apps": apps}


@router.get("/api/spaces/{name}/api")
async def space_api(
    name: str = Path(max_length=128, pattern=SPACE_PATTERN),
) -> dict[str, Any]:
    """The Space's endpoints (``view_api`` format): parameters with names, types, defaults."""
    described: dict[str, Any] = to_jsonable(await get_pool().endpoints(name))
    return described
