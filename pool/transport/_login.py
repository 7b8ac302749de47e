"""A Space behind Gradio's own login (``demo.launch(auth=...)``), for the native transport.

What Gradio does (gradio/routes.py): every route but ``app_id`` and ``login`` depends
on ``login_check``, which answers 401 ``{"detail": {"error": "Not authenticated",
"auth_message": ...}}`` to a request without a valid token; ``POST login`` (a form:
``username``, ``password``) answers 200 ``{"success": true}`` and sets the token as two
cookies, ``access-token-{cookie_id}`` (``Secure``) and ``access-token-unsecure-{cookie_id}``,
or 400 "Incorrect credentials.". The tokens live in the server's memory: a restarted
Space has forgotten them. gradio_client logs in once per ``Client``, before its
``/config``, and sends the cookies the login set on every later request
(gradio_client/client.py ``_login``, ``cookies=self.cookies``).

Here the login is the httpx ``auth`` of the Space's one client (:class:`GradioLogin`):
every request carries the login's cookies; a request answered 401 logs in and is sent
once more. One login serves every session of the Space (they all act as the one user
``POOL_SPACE_AUTH`` names, as the connections of one gradio_client would), and requests
answered 401 at once share one login. A login the Space refuses is not tried again
for :data:`REFUSED_S`, so a wrong password does not hammer it. The password is sent in
the login's form body and nowhere else; it is never in a header, a URL or a message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Generator

import httpx

from .._spaces import Login

LOGIN_PATH = "login"  # gradio_client utils.LOGIN_URL, under the Space's root (not its API)
REFUSED_S = 30.0


class GradioLogin(httpx.Auth):
    """The httpx auth of a Space's client when ``POOL_SPACE_AUTH`` names the Space."""

    def __init__(self, login: Login, login_url: str) -> None:
        self._login = login
        self._url = login_url
        self._http: httpx.AsyncClient | None = None
        self._cookies: dict[str, str] = {}
        self._generation = 0  # +1 per login the Space accepted
        self._pending: asyncio.Future[bool] | None = None
        self._refused_until = 0.0  # monotonic

    def bind(self, http: httpx.AsyncClient) -> None:
        """The client the login is posted with (the one this auth belongs to)."""
        self._http = http

    def sync_auth_flow(
        self, request: httpx.Request
    ) -> Generator[httpx.Request, httpx.Response, None]:
        raise RuntimeError("GradioLogin serves an httpx.AsyncClient only")

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        sent = request.headers.get("cookie", "")
        generation = self._generation
        _with_cookies(request, sent, self._cookies)
        response = yield request
        if response.status_code != 401:
            return
        if await self._logged_in_since(generation):
            _with_cookies(request, sent, self._cookies)
            yield request

    async def _logged_in_since(self, generation: int) -> bool:
        """Whether a login newer than ``generation`` holds (made now if needed)."""
        if self._generation != generation:
            return True  # another request logged in meanwhile
        if time.monotonic() < self._refused_until:
            return False
        if self._pending is None or self._pending.done():
            self._pending = asyncio.ensure_future(self._post())
        return await asyncio.shield(self._pending)

    async def _post(self) -> bool:
        assert self._http is not None, "bound"
        form = {"username": self._login.username, "password": self._login.password}
        try:
            response = await self._http.post(self._url, data=form, auth=httpx.Auth())
        except httpx.HTTPError:
            return False
        if response.status_code != 200:
            self._refused_until = time.monotonic() + REFUSED_S
            return False
        self._cookies = {c.name: c.value or "" for c in response.cookies.jar}
        self._generation += 1
        return True


def _with_cookies(request: httpx.Request, sent: str, cookies: dict[str, str]) -> None:
    """``request``'s own cookie header ``sent`` plus ``cookies`` it does not name."""
    own = {part.split("=", 1)[0].strip() for part in sent.split(";") if "=" in part}
    added = "; ".join(f"{k}={v}" for k, v in cookies.items() if k not in own)
    header = "; ".join(part for part in (sent, added) if part)
    if header:
        request.headers["cookie"] = header
