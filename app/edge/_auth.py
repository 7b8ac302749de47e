"""Bearer-token checks, as FastAPI dependencies: the one boundary both faces go through.

Two tokens (SPEC 6): ``POOL_ADMIN_TOKEN`` guards ``/api/admin/*`` — unset, every admin
request is refused (403) and a warning is logged at start-up; ``POOL_API_TOKEN``
guards ``/api/predict``, ``/api/jobs*``, the files, spaces, sessions and the Gradio
front ``/gradio/…`` when set. Comparison is constant-time (``hmac.compare_digest``)
and tokens are never logged or echoed.

**API keys** (app/teams/_keys.py) are accepted wherever the API token is, as
``Authorization: Bearer <key>``. A key is a consumer of the pool: its calls carry
it (``pool._consumer.CURRENT``: its limit, its users, its default priority) and are
metered under it (app/teams/_usage.py). A request that makes a call (:func:`_makes_call`)
is first checked against the key's daily quotas: 429 before any slot is taken. The
API token is a key with no limits; a bearer that starts with ``sp_`` and is no live
key (revoked, or never made) is refused even when no API token is configured.

**Revocation and quotas reach accepted work** (issue 38): a key's request also sets
:data:`GATE`, which follows its calls into the tasks they start (a job, a front event);
each call passes it (:func:`pass_gate`) once admitted, before anything reaches the
Space: a key revoked meanwhile ends the call ``key_revoked`` (401), a key whose
``daily_space_seconds`` are used up by its finished and running calls ends it
``quota_daily_space_seconds`` (429). Calls already running finish.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from contextvars import ContextVar

from fastapi import Request
from opentelemetry import trace
from pydantic import SecretStr

from pool import get_pool
from pool.admission import CURRENT

from ..core import AuthError, context_of, services_of, settings_of
from ..teams import KEY_PREFIX, METER, OPEN_KEY, TOKEN_KEY, KeyRecord, Keys, Meter, Usage


def _presented(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _same(presented: str, expected: SecretStr) -> bool:
    return hmac.compare_digest(
        presented.encode("utf-8", "surrogateescape"),
        expected.get_secret_value().encode("utf-8", "surrogateescape"),
    )


def _check(request: Request, expected: SecretStr, realm: str) -> None:
    presented = _presented(request)
    if presented is None:
        raise AuthError(401, "unauthorized", f"{realm}: send Authorization: Bearer <token>")
    if not _same(presented, expected):
        raise AuthError(401, "unauthorized", f"{realm}: wrong token")


def _makes_call(request: Request) -> bool:
    """Whether the request starts a call to a Space (what a quota counts)."""
    if request.method != "POST":
        return False
    path = request.url.path
    return (
        path in ("/api/predict", "/api/jobs")
        or path.endswith("/gradio_api/queue/join")
        or "/gradio_api/call/" in path
        or "/gradio_api/run/" in path
    )


Gate = Callable[[], Awaitable[None]]
GATE: ContextVar[Gate | None] = ContextVar("spacepool_gate", default=None)
"""What a call of the current key passes once admitted (module docstring)."""


def gate_of(keys: Keys, usage: Usage, key_id: str) -> Gate:
    """The gate of key ``key_id``: live (this process's copy of the keys, which follows
    every change in the fleet) and within its ``daily_space_seconds``."""

    async def gate() -> None:
        record = keys.get(key_id)
        if record is None:
            raise AuthError(401, "key_revoked", "the call's API key was revoked")
        await usage.may_start(record)

    return gate


async def pass_gate(space: str | None = None) -> None:
    """The current call, admitted: on, or ended as its key's gate says (None: no key).

    ``space``: the Space a JSON API call was admitted on. A Space behind Gradio's login
    (``POOL_SPACE_AUTH``) runs the calls of callers the operator let in — the API token
    or an API key — never an open caller's (403 ``space_login_required``): the pool's
    own login is not theirs to use (issue 38, F6). The front checks its own login."""
    gate = GATE.get()
    if gate is not None:
        await gate()
    meter = METER.get()
    if space is not None and meter is not None and meter.key_id == OPEN_KEY[0]:
        spaces = get_pool().spaces
        if space in spaces and spaces[space].spec.login is not None:
            raise AuthError(403, "space_login_required",
                            f"the Space {space!r} is behind a login: call it with"
                            " POOL_API_TOKEN or an API key")  # fmt: skip


async def require_api_token(request: Request) -> None:
    """The API token or a live API key (when a token is configured, one of them)."""
    expected = settings_of(request).api_token
    presented = _presented(request)
    keys = services_of(request).find(Keys)
    if request.url.path.startswith("/api/jobs/") and is_admin(request):  # every team's jobs
        METER.set(Meter(*TOKEN_KEY, context_of(request)))
        return
    if presented is not None and expected is not None and _same(presented, expected):
        METER.set(Meter(*TOKEN_KEY, context_of(request)))
        return
    if presented is not None and keys is not None:
        record = await keys.find(presented)
        if record is not None:
            await _enter(request, record)
            return
        if (revoked := keys.revoked(presented)) is not None:
            raise AuthError(401, "key_revoked", f"the API key {revoked.name!r} was revoked"
                            " by the operator: ask for a new key")  # fmt: skip
        if expected is not None or presented.startswith(KEY_PREFIX):
            raise AuthError(401, "unauthorized", "POOL_API_TOKEN or API key: wrong token")
    elif expected is not None:
        _check(request, expected, "POOL_API_TOKEN")
    METER.set(Meter(*OPEN_KEY, context_of(request)))


async def _enter(request: Request, record: KeyRecord) -> None:
    """The request runs as ``record``'s consumer; a call is counted against its quota."""
    if _makes_call(request):
        usage = services_of(request).get(Usage)
        day = await usage.admit_call(record)

        async def unspend() -> None:  # the request made no call after all (app/core/_logging.py)
            await usage.unspend_call(record, day)

        context_of(request).unspend = unspend
    services = services_of(request)
    GATE.set(gate_of(services.get(Keys), services.get(Usage), record.id))
    CURRENT.set(record.consumer())
    METER.set(Meter(record.id, record.name, context_of(request)))
    context_of(request).key = record.name
    trace.get_current_span().set_attribute("spacepool.key", record.name)  # app/core/_tracing.py


def is_admin(request: Request) -> bool:
    """Whether the request carries the admin token (which sees every team's work)."""
    expected = settings_of(request).admin_token
    presented = _presented(request)
    return expected is not None and presented is not None and _same(presented, expected)


async def require_admin_token(request: Request) -> None:
    """``/api/admin/*``: the admin token; refused outright when none is configured."""
    expected = settings_of(request).admin_token
    if expected is None:
        raise AuthError(403, "admin_disabled", "admin endpoints are off: POOL_ADMIN_TOKEN unset")
    _check(request, expected, "POOL_ADMIN_TOKEN")
