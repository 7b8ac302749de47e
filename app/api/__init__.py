"""The JSON API: ``POST /api/predict`` (answered whole or as Server-Sent Events), the
jobs (``/api/jobs``), output files (``/api/files``), discovery (``/api/spaces``) and
sessions (``/api/sessions``)."""

from __future__ import annotations

from ._files import router as files_router
from ._jobs import router as jobs_router
from ._predict import router as predict_router
from ._sessions import router as sessions_router
from ._spaces import router as spaces_router

__all__ = ["files_router", "jobs_router", "predict_router", "sessions_router", "spaces_router"]
