"""Gradio's own login, answered by the front for a Space behind one (``auth=``).

What a Space does (gradio/routes.py): every route but ``app_id`` and ``login`` depends
on ``login_check``, which answers 401 ``{"detail": {"error": "Not authenticated",
"auth_message": ...}}`` without a valid token; ``POST login`` (a form: ``username``,
``password``) sets the token as a cookie, or answers 400 "Incorrect credentials.";
without ``auth`` it redirects to the root. gradio_client raises ``AuthenticationError``
when ``config`` answers 401 and logs in with ``Client(url, auth=(user, password))``,
then sends the login's cookies on every request (gradio_client/client.py ``_login``,
``_get_config``); @gradio/client does the same (client/js/src/helpers/init_helpers.ts
``get_cookie_header``).

Here, for a scope (``/gradio/{alias}`` or ``/gradio``) with a Space that
``POOL_SPACE_AUTH`` names (so the pool itself can log in: pool/transport/_login.py):

* every route of the scope but ``login`` and ``logout`` answers ``login_check``'s 401
  unless the request carries this front's login cookie for the scope (:func:`refusal`);
* ``POST login`` hands the caller's username and password to the Space's own login,
  so the Space decides; accepted, the Space's token is given back at once (its
  ``logout``) and the caller gets the front's own cookie instead, never the Space's:
  ``<expiry>.<hmac>`` of the scope and expiry under the fleet's shared secret
  (``Pool.sign``), valid on every worker and host for :data:`LOGIN_TTL_S`. Nothing is
  stored; the password is not kept past the request. Refused, the answer is 401
  "Incorrect credentials." (the Space says 400): 401 is what both clients report as
  wrong credentials (gradio_client ``AuthenticationError``, @gradio/client "Invalid
  credentials"), where a 400 is an opaque "Could not login";
* ``login`` is not behind ``POOL_API_TOKEN``: gradio_client's ``_login`` sends no
  headers. The cookie alone opens nothing there: every other route still needs the token;
* failed logins are counted fleet-wide (the coordinator's shared values), per Space
  the login goes to (so every scope leading to it counts together), caller address and
  username (normalized: NFKC, case-folded — a Space whose login ignores case gains
  nothing from variants), and per Space and address across usernames. A guess is
  counted *before* the Space is asked, atomically (:meth:`SharedValues.update`): at
  :data:`FAILURES_MAX` for that username (:data:`ADDRESS_FAILURES_MAX` for the address)
  within :data:`FAILURE_WINDOW_S` of each other, the login is answered 429 with
  ``Retry-After`` before the Space is asked, so however many guesses arrive at once, no
  more than the limit reach the Space (issue 38) — the front is not a way to guess a
  Space's passwords at its own speed (Gradio counts nothing). A success clears the
  username's count and gives its guess back; a Space that did not answer gives every
  guess back. With the store out of reach nothing is counted (as every limit kept
  there).

A caller's login opens the front to that caller; the Space's events then run as the
pool's login (``POOL_SPACE_AUTH``'s user), as every call of the pool does.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
import unicodedata
import urllib.parse

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from pool import Pool, PoolError, UnknownSpace, UpstreamError, get_pool
from pool.admission import SharedValues
from pool.transport import ProtocolNotSupported

LOGIN_TTL_S = 24 * 3600
FAILURES_MAX = 10  # failed logins of one caller as one user on one Space …
ADDRESS_FAILURES_MAX = 30  # … or of one caller as any user on one Space …
FAILURE_WINDOW_S = 600.0  # … each within this long of the last: then 429 until it passes
COOKIE = "spacepool-login"
NOT_AUTHENTICATED = {"detail": {"error": "Not authenticated", "auth_message": None}}


def _cookie_name(scope: str | None) -> str:
    return COOKIE if scope is None else f"{COOKIE}-{scope}"


def _guarded(pool: Pool, scope: str | None) -> list[str]:
    """The scope's Spaces behind Gradio's login (``POOL_SPACE_AUTH`` names them)."""
    names = [scope] if scope is not None else list(pool.spaces)
    return [n for n in names if n in pool.spaces and pool.spaces[n].spec.login is not None]


def _mac(pool: Pool, scope: str | None, expiry: str) -> str:
    return pool.sign(f"spacepool gradio login\n{scope or ''}\n{expiry}")


async def refusal(request: Request, scope: str | None) -> Response | None:
    """``login_check``'s 401 for a request of a guarded scope without a valid login
    cookie; None when the request may go on."""
    pool = get_pool()
    if not _guarded(pool, scope):
        return None
    await pool.start()
    expiry, _, mac = request.cookies.get(_cookie_name(scope), "").partition(".")
    fresh = expiry.isdigit() and int(expiry) > time.time()
    if fresh and hmac.compare_digest(mac.encode(), _mac(pool, scope, expiry).encode()):
        return None
    return JSONResponse(NOT_AUTHENTICATED, status_code=401)


async def login(request: Request, scope: str | None, front_root: str) -> Response:
    """``POST login``: the Space checks the credentials; the front's cookie if it accepts."""
    pool = get_pool()
    if scope is not None and scope not in pool.spaces:
        raise UnknownSpace(scope, list(pool.spaces))
    names = _guarded(pool, scope)
    if not names:  # as a Space without auth answers it
        return RedirectResponse(front_root, status_code=302)
    async with request.form(max_files=0, max_fields=8) as form:
        username, password = form.get("username"), form.get("password")
    if not isinstance(username, str) or not isinstance(password, str):
        return JSONResponse({"detail": "username and password are required"}, status_code=422)
    await pool.start()
    values = pool.coordinator.values
    user_keys, address_keys = _failures_keys(pool, request, names, username)
    taken = await _take(values, [(k, FAILURES_MAX) for k in user_keys]
                        + [(k, ADDRESS_FAILURES_MAX) for k in address_keys])  # fmt: skip
    if taken is None:
        return JSONResponse({"detail": "Too many failed logins: try again later."},
                            status_code=429,
                            headers={"Retry-After": str(int(FAILURE_WINDOW_S))})  # fmt: skip
    try:
        accepted = await _space_accepts(pool, names, username.strip(), password)
    except BaseException:
        await asyncio.shield(_give_back(values, taken))  # not a guess the Space judged
        raise
    if not accepted:
        return JSONResponse({"detail": "Incorrect credentials."}, status_code=401)
    with contextlib.suppress(PoolError):
        for key in user_keys:
            await values.delete(key)
        await _give_back(values, [k for k in taken if k in address_keys])
    expiry = str(int(time.time() + LOGIN_TTL_S))
    response = JSONResponse({"success": True})
    response.set_cookie(
        _cookie_name(scope), f"{expiry}.{_mac(pool, scope, expiry)}", max_age=LOGIN_TTL_S,
        path=urllib.parse.urlsplit(front_root).path or "/", httponly=True, samesite="lax",
        secure=request.url.scheme == "https",
    )  # fmt: skip
    return response


def _failures_keys(
    pool: Pool, request: Request, names: list[str], username: str
) -> tuple[list[str], list[str]]:
    """The counts a login of ``username`` from this address to ``names`` takes a place
    in: per Space, address and normalized username; per Space and address. Keyed
    hashes (the fleet's secret): a username may be an email, never stored plain."""
    address = request.client.host if request.client is not None else ""
    normal = unicodedata.normalize("NFKC", username.strip()).casefold()
    users, addresses = [], []
    for name in names:
        who = pool.sign(f"spacepool login failures\n{name}\n{address}\n{normal}")
        users.append(f"glogin:f:{who[:40]}")
        where = pool.sign(f"spacepool login failures by address\n{name}\n{address}")
        addresses.append(f"glogin:a:{where[:40]}")
    return users, addresses


async def _take(values: SharedValues, counts: list[tuple[str, int]]) -> list[str] | None:
    """A place in each count (key, limit), each taken atomically; None when one is at
    its limit (the places taken given back). The store out of reach: nothing taken."""
    taken: list[str] = []
    for key, limit in counts:
        added = False

        def add(raw: str | None, limit: int = limit) -> str | None:
            nonlocal added  # pure but for this flag: the last run is the one stored
            count = int(raw) if raw is not None and raw.isdigit() else 0
            added = count < limit
            return str(count + 1) if added else None

        try:
            await values.update(key, add, FAILURE_WINDOW_S)
        except PoolError:
            continue
        if not added:
            await _give_back(values, taken)
            return None
        taken.append(key)
    return taken


async def _give_back(values: SharedValues, keys: list[str]) -> None:
    """One place back in each of ``keys`` (a guess that was not a failure)."""

    def less(raw: str | None) -> str | None:
        count = int(raw) if raw is not None and raw.isdigit() else 0
        return str(max(0, count - 1)) if count else None

    for key in keys:
        with contextlib.suppress(PoolError):
            await values.update(key, less, FAILURE_WINDOW_S)


def logout(scope: str | None, front_root: str) -> Response:
    """``GET logout``: the front's cookie dropped, back to the root (gradio/routes.py)."""
    response = RedirectResponse(front_root, status_code=302)
    response.delete_cookie(_cookie_name(scope), path=urllib.parse.urlsplit(front_root).path or "/")
    return response


async def _space_accepts(pool: Pool, names: list[str], username: str, password: str) -> bool:
    """Whether the first of ``names`` that answers accepts the login (gradio/routes.py
    ``login``: 200, or 400 "Incorrect credentials."; ``Pool.space_login``: its token
    given back at once)."""
    last: Exception | None = None
    for name in names:
        try:
            return await pool.space_login(name, username, password)
        except UpstreamError:
            raise
        except (httpx.HTTPError, PoolError, ProtocolNotSupported) as exc:
            last = exc
    raise UpstreamError(f"no Space answered the login ({type(last).__name__})")
