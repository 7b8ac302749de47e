"""The JSON API: ``POST /api/predict`` (answered whole or as Server-Sent Events), the
jobs, discovery (``/api/spaces``) and sessions (``/api/sessions``)."""

from __future__ import annotations

from ._predict import router as predict_router
from ._sessions import router as sessions_router
from ._spaces import router as spaces_router
from ._streaming import KEEPALIVE_S

__all__ = ["KEEPALIVE_S", "predict_router", "sessions_router", "spaces_router"]
