"""``GET /readyz``: readiness, apart from ``/healthz`` (liveness).

Ready (200) only when both hold:

* the admission store answers (its snapshot within ``_STORE_S``): without it
  nothing is admitted, so a load balancer should send callers elsewhere;
* every configured app has at least one Space that is *up or wakeable*: up — its
  breaker is not open, it is not in a failure cool-down, and it answers its cheap
  ``app_id`` route now (or the Hub says it runs); wakeable — the Hub says it
  sleeps or is paused (the pool wakes it on the next call) or is building/starting.

Otherwise 503 with what failed. An app is a Space's explicit group, else the Spaces
with its API (pool/routing/_apps.py), else the Space itself while its API is unknown.
Answers are kept ``_CACHE_S`` so that a probe every second costs the Spaces nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx

from pool import Pool

_STORE_S = 2.0
_PROBE_S = 2.0
_CACHE_S = 1.0
_WAKEABLE = {"SLEEPING", "PAUSED", "BUILDING", "APP_STARTING", "RUNNING_BUILDING"}


class Readiness:
    """The readiness answer of one process, kept ``_CACHE_S``."""

    def __init__(self) -> None:
        self._http = httpx.AsyncClient(timeout=_PROBE_S, follow_redirects=False)
        self._last: tuple[float, bool, dict[str, Any]] | None = None
        self._lock = asyncio.Lock()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def check(self, pool: Pool) -> tuple[bool, dict[str, Any]]:
        async with self._lock:
            if self._last is not None and time.monotonic() - self._last[0] < _CACHE_S:
                return self._last[1], self._last[2]
            ready, body = await self._check(pool)
            self._last = (time.monotonic(), ready, body)
            return ready, body

    async def _check(self, pool: Pool) -> tuple[bool, dict[str, Any]]:
        store = await _store_answers(pool)
        names = list(pool.spaces)
        states = await asyncio.gather(*(self._space_state(pool, n) for n in names))
        state_of = dict(zip(names, states, strict=True))
        apps: dict[str, list[str]] = {}
        for name in names:
            apps.setdefault(_app_of(pool, name), []).append(name)
        ready_apps = {app: any(state_of[n] in ("up", "wakeable") for n in members)
                      for app, members in apps.items()}  # fmt: skip
        ready = store and all(ready_apps.values())
        shown = {app: {"ready": ok, "spaces": {n: state_of[n] for n in apps[app]}}
                 for app, ok in ready_apps.items()}  # fmt: skip
        body = {
            "status": "ready" if ready else "not_ready",
            "coordinator": "ok" if store else "unreachable",
            "apps": shown,
        }
        return ready, body

    async def _space_state(self, pool: Pool, name: str) -> str:
        """``up``, ``wakeable`` or ``down`` (module docstring)."""
        sp = pool.spaces[name]
        with contextlib.suppress(Exception):
            if pool.board.get(name).breaker == "open":
                return "down"
        if not sp.is_up():
            return "down"
        probe_url = sp.probe_url
        if probe_url is None and sp.spec.src.startswith(("http://", "https://")):
            probe_url = sp.spec.src + "gradio_api/app_id"  # not connected yet: Gradio's route
        if probe_url is not None:  # even with connections open: a frozen Space keeps them
            with contextlib.suppress(httpx.HTTPError):
                if (await self._http.get(probe_url)).status_code == 200:
                    return "up"
        if sp.spec.is_hub:
            stage = None
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_PROBE_S):
                    stage = await pool.waker.stage(sp.spec)
            if stage == "RUNNING":
                return "up"
            if stage in _WAKEABLE:
                return "wakeable"
        return "down"


def _app_of(pool: Pool, name: str) -> str:
    try:
        return pool.apps.app_of(name) or name
    except Exception:
        return name


async def _store_answers(pool: Pool) -> bool:
    try:
        async with asyncio.timeout(_STORE_S):
            snap = await pool.coordinator.snapshot()
    except Exception:
        return False
    return snap.reachable
