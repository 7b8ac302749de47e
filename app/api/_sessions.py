"""Sessions over HTTP: a conversation with one Space whose ``gr.State`` lives across calls.

* ``POST /api/sessions`` ``{"email"?, "space"?, "api_name"?}`` → 201 ``{"session",
  "space", "expires_at"}`` (``Pool.open_session``): on the Space named, else unpinned
  (``"space": null``) until its first call, which is routed by its ``api_name`` like
  any call (the user's pin in that app, when there is one) and pins it; ``api_name``
  binds the session to the app that has that endpoint (its replica is still chosen at
  the first call);
* ``"session": "<id>"`` in a ``/api/predict`` or ``/api/jobs`` body continues it (with
  the same ``email`` as opened it);
* ``GET /api/sessions/{id}`` and ``DELETE /api/sessions/{id}`` (``?email=`` when it was
  opened with one: without it, the 404's message says so, whether the session exists or
  not).

An unknown, expired, deleted or someone else's session is a 404 ``session_not_found``;
a session whose Space restarted is a 410 ``session_lost`` (:mod:`pool._sessions`).
One email (every anonymous caller together counting as one) holds at most
``POOL_MAX_SESSIONS_PER_USER`` open sessions, fleet-wide: beyond, 429
``too_many_sessions`` with ``Retry-After``.
The record is in the coordinator, so any worker or host serves any turn. Same auth as
``/api/predict``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from pool import PoolSession, SessionNotFound, get_pool

from ..core import context_of, settings_of
from ..edge import (
    API_NAME_PATTERN,
    EMAIL_MAX_CHARS,
    EMAIL_PATTERN,
    ERROR_RESPONSES,
    SPACE_PATTERN,
    require_api_token,
)

router = APIRouter(
    dependencies=[Depends(require_api_token)], tags=["sessions"], responses=ERROR_RESPONSES
)
SESSION_PATTERN = r"^[A-Za-z0-9_-]{16,64}$"


class SessionRequest(BaseModel):
    """Body of ``POST /api/sessions``."""

    model_config = ConfigDict(extra="forbid")

    email: str | None = Field(default=None, max_length=EMAIL_MAX_CHARS, pattern=EMAIL_PATTERN)
    space: str | None = Field(default=None, max_length=128, pattern=SPACE_PATTERN)
    api_name: str | None = Field(
        default=None, max_length=129, pattern=API_NAME_PATTERN,
        description="binds the session to the app with this endpoint (without space)",
    )  # fmt: skip


    @field_validator("api_name")
    @classmethod
    def _leading_slash(cls, value: str | None) -> str | None:
        return value if value is None or value.startswith("/") else "/" + value


class SessionView(BaseModel):
    """A session: its id, its Space (null until its first call pins it), and when it
    ends unless a call comes first."""

    session: str
    space: str | None
    expires_at: str = Field(description="UTC; every call moves it POOL_SESSION_IDLE_S on")


def _view(session: PoolSession) -> SessionView:
    when = datetime.fromtimestamp(session.expires_at, UTC).isoformat(timespec="seconds")
    return SessionView(
        session=session.id, space=session.space or None, expires_at=when.replace("+00:00", "Z")
    )


_ID = Path(pattern=SESSION_PATTERN, max_length=64)
_EMAIL = Query(default=None, max_length=EMAIL_MAX_CHARS, pattern=EMAIL_PATTERN)


@router.post("/api/sessions", status_code=201, response_model=SessionView)
async def open_session(body: SessionRequest, request: Request) -> SessionView:
    """Open a session on the caller's Space (or the one named)."""
    pool = get_pool()
    context_of(request).user = pool.hash_user(body.email) if body.email else None
    settings = settings_of(request)
    session = await pool.open_session(
        body.email, body.space, limit=settings.max_sessions_per_user, api_name=body.api_name
    )
    context_of(request).space = session.space or None
    return _view(session)


@router.get("/api/sessions/{session_id}", response_model=SessionView)
async def get_session(session_id: str = _ID, email: str | None = _EMAIL) -> SessionView:
    """The session, if it is live and the caller's."""
    with _owner_hint(email):
        return _view(await get_pool().get_session(session_id, email))


@router.delete("/api/sessions/{session_id}", status_code=204)
async def delete_session(session_id: str = _ID, email: str | None = _EMAIL) -> None:
    """End the session; its next call is a 404."""
    with _owner_hint(email):
        await get_pool().close_session(session_id, email)


NO_OWNER_HINT = (
    "no such session for an anonymous caller (unknown, expired, or opened with an email):"
    " a user's sessions are named with ?email= (the email that opened it),"
    " e.g. DELETE /api/sessions/{id}?email=alice@example.com"
)


@contextlib.contextmanager
def _owner_hint(email: str | None) -> Iterator[None]:
    """A 404 for a GET or DELETE that names no owner says how a user's sessions are named;
    the same words whether the session exists or not (nothing revealed)."""
    try:
        yield
    except SessionNotFound as exc:
        if email is not None:
            raise
        raise SessionNotFound(NO_OWNER_HINT) from exc
