"""What a Space serves without admission: its app (config, API), its API info, its
files, its login, its heartbeat cadence.

None of these runs anything on the Space, so none takes a slot: they are read through
the Space's native transport (pool/transport/_space.py ``SpaceTransport``), which the
pool's connections of the Space share. :class:`SpaceReads` finds it on a live
connection of the Space, opening one (and handing it straight back) only when the Space
has none yet, as :meth:`Pool.endpoints <pool.Pool.endpoints>` does. The Gradio front
(app/gradio) reads everything it serves without admission here, through
:class:`~pool.Pool`'s ``space_*`` methods, and never holds a connection or a transport.

Each raises :class:`~pool.UnknownSpace` for a name that is not configured and
:class:`~pool.transport.ProtocolNotSupported` for a Space that the native transport
does not speak (the fallback transport, ``POOL_TRANSPORT=gradio_client``).
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from ._exceptions import UnknownSpace, UpstreamError
from .connections import SpacePool
from .transport import AppInfo, SpaceTransport


class SpaceReads:
    """Reads of the Spaces ``spaces`` that take no admission (see the module docstring)."""

    def __init__(self, spaces: Mapping[str, SpacePool]) -> None:
        self._spaces = spaces

    async def _wire(self, name: str) -> tuple[SpaceTransport, AppInfo]:
        """The Space's transport and app as last read (re-read when the Space restarts);
        a connection is opened and handed back at once if it has none yet."""
        sp = self._spaces.get(name)
        if sp is None:
            raise UnknownSpace(name, list(self._spaces))
        conn = sp.current_connection()
        leased = None
        if conn is None:
            leased = conn = await sp.checkout()
        try:
            return conn.client.wire()
        finally:
            if leased is not None:
                sp.checkin(leased, discard=False)

    async def app(self, name: str) -> AppInfo:
        """The Space's app: its config, endpoints, ``app_id`` and address (``src``)."""
        _, app = await self._wire(name)
        return app

    async def info(self, name: str, params: Mapping[str, str]) -> tuple[int, Any]:
        """The Space's ``gradio_api/info`` with ``params``: its status and JSON body."""
        transport, app = await self._wire(name)
        response = await transport.home.send(transport.http, "GET", app.url("info"),
                                              params=dict(params))  # fmt: skip
        return response.status_code, response.json()

    @contextlib.asynccontextmanager
    async def file(self, name: str, path: str) -> AsyncIterator[httpx.Response | None]:
        """The Space's ``file=`` response for ``path`` (gradio/routes.py ``file``),
        open for streaming while the context lasts; None when the Space does not serve
        it. The home replica's cookies (pool/transport/_affinity.py): which session,
        hence which replica, made the file is not known."""
        transport, app = await self._wire(name)
        url = app.url("file=" + urllib.parse.quote(path, safe="/"))
        request = transport.http.build_request("GET", url, headers=transport.home.headers(url))
        response = await transport.http.send(request, stream=True)
        try:
            yield response if response.status_code == 200 else None
        finally:
            await response.aclose()

    @contextlib.asynccontextmanager
    async def web(self, name: str, path: str) -> AsyncIterator[httpx.Response]:
        """The Space's own web page or one of the files it loads (``path`` under the
        Space's address: ``""`` for its page, ``assets/…``, ``theme.css``,
        ``gradio_api/custom_component/…``; gradio/routes.py ``main``,
        ``build_resource``, …), with the pool's login if the Space has one; open for
        streaming while the context lasts, whatever its status."""
        transport, app = await self._wire(name)
        url = app.src + path
        request = transport.http.build_request("GET", url, headers=transport.home.headers(url))
        response = await transport.http.send(request, stream=True)
        try:
            yield response
        finally:
            await response.aclose()

    async def login(self, name: str, username: str, password: str) -> bool:
        """Whether the Space's own login (gradio/routes.py ``login``) accepts
        ``username`` and ``password``; the token it gives is handed back at once (its
        ``logout``, this token only): not the pool's to keep. Not the pool's own login
        (``POOL_SPACE_AUTH``): these are the caller's. :class:`~pool.UpstreamError`
        when the Space answers neither yes nor no; ``httpx.HTTPError`` when it does not
        answer."""
        transport, _ = await self._wire(name)
        answer = await transport.http.post(  # httpx.Auth(): not the pool's own login
            transport.src + "login", data={"username": username, "password": password},
            auth=httpx.Auth(),
        )  # fmt: skip
        if answer.status_code in (400, 401, 403):
            return False
        if answer.status_code != 200:
            raise UpstreamError(f"the Space's login answered HTTP {answer.status_code}")
        cookie = "; ".join(f"{c.name}={c.value}" for c in answer.cookies.jar)
        with contextlib.suppress(httpx.HTTPError):  # all_session=false: this token only
            await transport.http.get(transport.src + "logout", params={"all_session": "false"},
                                     headers={"cookie": cookie}, auth=httpx.Auth())  # fmt: skip
        return True

    async def cadence(self, name: str) -> float | None:
        """The Space's heartbeat interval as the pool measured it on its heartbeat and
        data streams (Gradio's ``GRADIO_HEARTBEAT_INTERVAL``); None while not known,
        and then measured in the background (``SpaceTransport.measure_cadence``)."""
        transport, _ = await self._wire(name)
        interval = transport.cadence.interval_s
        if interval is None:
            transport.measure_cadence()
        return interval
