"""Bearer-token checks, as FastAPI dependencies.

Two tokens (SPEC 6): ``POOL_ADMIN_TOKEN`` guards ``/api/admin/*`` — unset, every admin
request is refused (403) and a warning is logged at start-up; ``POOL_API_TOKEN``
guards ``/api/predict`` and ``/api/jobs*`` when set. Comparison is constant-time
(``hmac.compare_digest``) and tokens are never logged or echoed.
"""

from __future__ import annotations

import hmac

from fastapi import Request
from pydantic import SecretStr

from ._errors import AuthError
from ._settings import ServiceSettings


def _presented(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _check(request: Request, expected: SecretStr, realm: str) -> None:
    presented = _presented(request)
    if presented is None:
        raise AuthError(401, "unauthorized", f"{realm}: send Authorization: Bearer <token>")
    if not hmac.compare_digest(
        presented.encode("utf-8", "surrogateescape"),
        expected.get_secret_value().encode("utf-8", "surrogateescape"),
    ):
        raise AuthError(401, "unauthorized", f"{realm}: wrong token")


def _settings(request: Request) -> ServiceSettings:
    settings: ServiceSettings = request.app.state.settings
    return settings


async def require_api_token(request: Request) -> None:
    """``/api/predict`` and ``/api/jobs*``: the API token, when one is configured."""
    expected = _settings(request).api_token
    if expected is not None:
        _check(request, expected, "POOL_API_TOKEN")


async def require_admin_token(request: Request) -> None:
    """``/api/admin/*``: the admin token; refused outright when none is configured."""
    expected = _settings(request).admin_token
    if expected is None:
        raise AuthError(403, "admin_disabled", "admin endpoints are off: POOL_ADMIN_TOKEN unset")
    _check(request, expected, "POOL_ADMIN_TOKEN")
