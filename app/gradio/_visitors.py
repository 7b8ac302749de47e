"""Who a browser visitor of the front's pages is: a signed cookie (issue 42).

A Space's page served by the front (:mod:`._pages`) loads with no header naming its
user: every visitor would be one user (the open front's anonymous caller, whose
per-user caps, pins and sessions they would then share). So the front gives each
browser a visitor id on a page's first load: ``spacepool-visitor`` = ``<id>.<mac>``,
a random id and its HMAC under the fleet's shared secret (``Pool.sign``: valid on every
worker and host), ``HttpOnly``, ``SameSite=Lax``, scoped to ``/gradio``. While pages are
served, a front request without ``X-Spacepool-User`` that carries a valid visitor
cookie is that visitor's: the user ``visitor-<id>@visitors.invalid`` of the request's
consumer (its API key's, or the open front's anonymous consumer), hashed as every
user. A proxy that names its users (``X-Spacepool-User``) wins over the cookie. Nothing
is stored: the cookie is the whole record.

A visitor id is a pseudonym anyone can mint (load the page again without the cookie), so
a visitor's calls are made :func:`as_visitor`: each also takes the consumer's anonymous
slot (``POOL_ANONYMOUS_MAX_CONCURRENT`` bounds every visitor together, as it bounds the
anonymous callers), while its pins, sessions and per-user bounds stay its own.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import urllib.parse
from collections.abc import Iterator

from fastapi import Request
from fastapi.responses import Response

from pool import get_pool
from pool.admission import PSEUDONYMOUS

from ..core import settings_of

COOKIE = "spacepool-visitor"
VISITOR_TTL_S = 30 * 24 * 3600
_DOMAIN = "visitors.invalid"  # RFC 2606: never a real address


def _mac(visitor: str) -> str:
    return get_pool().sign(f"spacepool gradio visitor\n{visitor}")


def visitor_of(request: Request) -> str | None:
    """The request's visitor id (its cookie checked), or None."""
    raw = request.cookies.get(COOKIE, "")
    visitor, _, mac = raw.partition(".")
    if len(visitor) != 32 or not all(c in "0123456789abcdef" for c in visitor):
        return None
    if not hmac.compare_digest(mac.encode(), _mac(visitor).encode()):
        return None
    return visitor


def visitor_email(request: Request) -> str | None:
    """The visitor's user name (an email the JSON API's rule accepts) while pages are
    served; None without a valid cookie or with pages off."""
    if not settings_of(request).pages_on:
        return None
    visitor = visitor_of(request)
    return None if visitor is None else f"visitor-{visitor}@{_DOMAIN}"


def is_visitor(email: str | None) -> bool:
    """Whether ``email`` is a page visitor's (:func:`visitor_email`)."""
    return email is not None and email.endswith("@" + _DOMAIN)


@contextlib.contextmanager
def as_visitor(email: str | None) -> Iterator[None]:
    """The pool calls made inside count ``email``'s user as a visitor when it is one
    (pool/_consumer.py ``PSEUDONYMOUS``)."""
    token = PSEUDONYMOUS.set(is_visitor(email))
    try:
        yield
    finally:
        PSEUDONYMOUS.reset(token)


def welcome(request: Request, response: Response, front_path: str) -> None:
    """A new visitor's cookie on ``response`` unless the request has a valid one.
    ``front_path``: where the front's routes are (``/gradio`` under the root path)."""
    if visitor_of(request) is not None:
        return
    visitor = secrets.token_hex(16)
    response.set_cookie(
        COOKIE, f"{visitor}.{_mac(visitor)}", max_age=VISITOR_TTL_S, path=front_path,
        httponly=True, samesite="lax", secure=request.url.scheme == "https",
    )  # fmt: skip


def front_path(front_root: str) -> str:
    """``/gradio`` under the service's path (of ``POOL_PUBLIC_URL`` or the root path)."""
    path = urllib.parse.urlsplit(front_root).path.rstrip("/")
    head, sep, _ = path.partition("/gradio")
    return f"{head}/gradio" if sep else "/gradio"
