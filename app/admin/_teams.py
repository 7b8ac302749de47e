"""The admin's routes for several teams: API keys and their usage (issue 32).

* ``POST /api/admin/keys`` ``{"name", "max_concurrent", "priority"?, "daily_calls"?,
  "daily_space_seconds"?}`` → ``201 {"id", "name", "key", …}`` (``key`` only here);
* ``GET /api/admin/keys`` → ``{"keys": [...]}``; ``PATCH /api/admin/keys/{id}``
  (fields to change); ``DELETE /api/admin/keys/{id}`` → ``204`` (revoked);
* ``GET /api/admin/usage`` ``?key=&email=&user=&since=&until=&format=json|csv`` →
  per key and hour, and the top users (hashed) over the range; a ``key`` that names no
  key (live or revoked) and has no usage → 404 ``key_not_found``.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response

from pool import InvalidRequest, get_pool
from pool.admission import CURRENT

from ..core import KeyNotFound, services_of
from ..edge import EMAIL_MAX_CHARS, ERROR_RESPONSES, is_email, require_admin_token
from ..teams import OPEN_KEY, TOKEN_KEY, KeyChange, KeyCreate, KeyRecord, Keys, Usage, as_csv

router = APIRouter(
    dependencies=[Depends(require_admin_token)], tags=["admin"], responses=ERROR_RESPONSES
)


def keys_of(request: Request) -> Keys:
    return services_of(request).get(Keys)


@router.post("/api/admin/keys", status_code=201)
async def create_key(body: KeyCreate, request: Request) -> dict[str, Any]:
    """A new API key: its secret (``key``) is in this answer only."""
    record, secret = await keys_of(request).create(body)
    return {**record.view(), "key": secret}


@router.get("/api/admin/keys")
async def list_keys(request: Request) -> dict[str, Any]:
    """Every key (never a secret or its hash)."""
    keys = keys_of(request)
    await keys.reload()
    return {"keys": [r.view() for r in keys.all()]}


@router.patch("/api/admin/keys/{key_id}")
async def change_key(key_id: str, body: KeyChange, request: Request) -> dict[str, Any]:
    """Change a key's name, limit, priority or quotas; in force on every worker within 1 s."""
    return (await keys_of(request).change(key_id, body)).view()


@router.delete("/api/admin/keys/{key_id}", status_code=204)
async def revoke_key(key_id: str, request: Request) -> Response:
    """Revoke the key: refused on every worker within 1 s."""
    await keys_of(request).revoke(key_id)
    return Response(status_code=204)


def _epoch(value: str | None, default: float) -> float:
    if value is None or not value.strip():
        return default
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):
        raise InvalidRequest(f"not a time (epoch seconds or ISO 8601): {value[:40]!r}") from None


@router.get("/api/admin/usage", response_model=None)
async def usage(
    request: Request,
    key: str | None = Query(default=None, max_length=64, description="a key's name or id"),
    email: str | None = Query(default=None, max_length=EMAIL_MAX_CHARS,
                              description="one user of ``key`` (hashed here, never kept)"),
    user: str | None = Query(default=None, max_length=64, description="a user's hash"),
    since: str | None = Query(default=None, max_length=40),
    until: str | None = Query(default=None, max_length=40),
    format: Literal["json", "csv"] = "json",
) -> dict[str, Any] | Response:  # fmt: skip
    """Calls, errors by class, Space-seconds and admission-wait seconds per key and hour
    (the last 7 days), and the top users; CSV with ``format=csv``."""
    if email is not None:
        record = _key_record(keys_of(request), key)
        if not is_email(email):
            raise InvalidRequest("email must be an email address")
        token = CURRENT.set(record.consumer())
        try:
            user = get_pool().hash_user(email)  # within the key, as its calls hashed it
        finally:
            CURRENT.reset(token)
    meter = services_of(request).get(Usage)
    hours, users = await meter.rows(
        key=key, user=user, since=_epoch(since, 0.0), until=_epoch(until, math.inf)
    )
    if key is not None and not hours and not _known(keys_of(request), key):
        raise KeyNotFound(
            f"no key {key[:64]!r}: key= is a key's name or id (GET /api/admin/keys lists"
            f" them, revoked ones included), {TOKEN_KEY[0]!r} (POOL_API_TOKEN) or"
            f" {OPEN_KEY[0]!r} (no key)"
        )
    if format == "csv":
        return Response(as_csv(hours), media_type="text/csv; charset=utf-8")
    return {"hours": hours, "users": users[:100]}


def _known(keys: Keys, key: str) -> bool:
    """Whether ``key`` names a key (live or revoked) or one of the keyless meters."""
    names = {*TOKEN_KEY, *OPEN_KEY}
    return key in names or any(key in (r.id, r.name) for r in keys.all())


def _key_record(keys: Keys, key: str | None) -> KeyRecord:
    for record in keys.all():
        if key in (record.id, record.name) and record.revoked_at is None:
            return record
    raise InvalidRequest("email needs key= (the name or id of a live key)")
