"""The native transport behind the connection interface (:mod:`._interface`).

A :class:`NativeClient` is one pooled connection: the Space's one
:class:`~pool.transport.SpaceTransport` (shared by all its connections) and, per lease,
one :class:`~pool.transport.Session` — made on first use and retired when the
connection is returned (:meth:`NativeClient.reset_session`), so each lease starts with
a fresh ``session_hash``. Opening one costs a ``gradio_api/app_id`` request once the
Space's config is known; closing one ends its sessions' tasks. No thread anywhere.

A lease that continues a known session (:meth:`NativeClient.use_session`: pool/_sessions.py)
shares one :class:`~pool.transport.Session` with every other lease of the Space that
continues it at the same time (:class:`Continued`): Gradio gives a session one message
queue, read by one data stream, and ends the session's pending events when its
heartbeat closes (gradio/routes.py ``queue_data``, ``heartbeat``), so two readers
would split its messages and one lease's end would end another's events. The shared
session closes when the last of those leases is returned.

:class:`NativeOpener` opens them, and hands a Space whose protocol the transport does
not speak to the fallback opener (:mod:`._fallback`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Any

import httpx

from .._exceptions import PoolClosedError
from .._spaces import Login
from ._affinity import Affinity
from ._app import AppInfo, ProtocolNotSupported
from ._files import Downloaded
from ._interface import Relay, Replica, SpaceClient, SpaceOpener
from ._queue import Call, Session
from ._space import SpaceTransport
from ._tls import shared_ssl_context

CANCEL_WAIT_S = 8.0  # closing a connection waits this long at most for its cancels


class Continued:
    """The sessions leases of one Space continue now, by ``session_hash``: one
    :class:`Session` each, however many leases hold it (see the module docstring)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[Session, int]] = {}

    def take(self, session_hash: str, replica: Replica, space: SpaceTransport,
             app: AppInfo) -> Session:  # fmt: skip
        found = self._held.get(session_hash)
        if found is not None and not found[0].closed:
            self._held[session_hash] = (found[0], found[1] + 1)
            return found[0]
        session = Session(space, app, session_hash, Affinity(replica))
        self._held[session_hash] = (session, 1)
        return session

    def give_back(self, session: Session) -> bool:
        """One lease less holds ``session``; True when none does (it may be closed)."""
        found = self._held.get(session.hash)
        if found is None or found[0] is not session:
            return True
        if found[1] > 1:
            self._held[session.hash] = (session, found[1] - 1)
            return False
        del self._held[session.hash]
        return True


class NativeClient:
    """One pooled connection on the native transport (a :class:`SpaceClient`)."""

    cancel_wait_s = CANCEL_WAIT_S

    def __init__(
        self, space: SpaceTransport, app: AppInfo, continued: Continued | None = None
    ) -> None:
        self.transport = space
        self.app = app
        self._session: Session | None = None
        self._continued = continued if continued is not None else Continued()
        self._shared = False  # the lease's session is a continued one (held in _continued)
        self._retired: set[asyncio.Task[None]] = set()

    @property
    def app_id(self) -> object:
        return self.app.app_id

    @property
    def root(self) -> str:
        return self.app.prefixed

    @property
    def session(self) -> Session:
        """The current lease's session (made on first use)."""
        if self._session is None or self._session.closed:
            self._session = Session(self.transport, self.app)
        return self._session

    def api_names(self) -> list[str]:
        return self.app.api_names()

    def is_generator(self, api_name: str | None) -> bool:
        try:
            return self.app.endpoint(api_name).generator
        except ValueError:
            return True

    def view_api(self) -> dict[str, Any]:
        return self.app.view_api()

    def submit(
        self, api_name: str | None, args: tuple[Any, ...], kwargs: Mapping[str, Any],
        headers: Mapping[str, str] | None, keep: int,
    ) -> Call:  # fmt: skip
        return self.session.submit(api_name, args, kwargs, headers=headers, keep=keep)

    def probe_headers(self) -> dict[str, str]:
        return self.transport.home.headers(self.app.url("app_id"))

    async def download(
        self, data: dict[str, Any], directory: str | os.PathLike[str], *, max_bytes: int,
        headers: Mapping[str, str] | None, http: httpx.AsyncClient | None,
    ) -> Downloaded:  # fmt: skip
        """Through the Space's own HTTP client, with the session's replica cookies."""
        affinity = self._session.affinity if self._session is not None else None
        return await self.transport.download(
            data, directory, max_bytes=max_bytes, headers=headers, affinity=affinity
        )

    def use_session(self, session_hash: str, replica: Replica) -> None:
        self.reset_session()
        self._session = self._continued.take(session_hash, replica, self.transport, self.app)
        self._shared = True

    async def join_raw(
        self, fn_index: int, data: list[Any], relay: Relay, fields: Mapping[str, Any]
    ) -> Call:
        return await self.session.join_data(fn_index, data, relay=relay, fields=fields)

    async def replica_app_id(self, replica: Replica | None) -> tuple[object, Replica] | None:
        """Asked through ``replica``'s cookies (the Space's own jar for None)."""
        affinity = self.transport.home if replica is None else Affinity(replica)
        try:
            response = await affinity.send(self.transport.http, "GET", self.app.url("app_id"))
            response.raise_for_status()
            return response.json().get("app_id"), tuple(affinity.saved())
        except (httpx.HTTPError, ValueError):
            return None

    def reset_session(self) -> None:
        """Retire the current session (closed in the background): the next lease
        gets a fresh ``session_hash``, so no ``gr.State`` crosses users."""
        old, self._session = self._session, None
        shared, self._shared = self._shared, False
        if old is not None and (not shared or self._continued.give_back(old)):
            task = asyncio.get_running_loop().create_task(old.aclose())
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

    def settled(self) -> bool:
        return True  # a retired session closes in the background; the next is fresh

    async def settle(self) -> bool:
        return True

    def stop_streams(self) -> None:
        if self._session is not None:
            self._session.stop_streams()

    def wire(self) -> tuple[SpaceTransport, AppInfo]:
        return self.transport, self.transport.app or self.app

    async def aclose(self) -> None:
        """End the session's reader, heartbeat and calls; wait for retired ones."""
        self.reset_session()
        while self._retired:
            await asyncio.gather(*list(self._retired), return_exceptions=True)


class NativeOpener:
    """Opens native clients; one :class:`SpaceTransport` per Space source."""

    def __init__(
        self, *, token: str | None, connect_timeout_s: float, read_timeout_s: float,
        min_size: int, max_size: int, fallback: SpaceOpener, executor: Executor,
        logins: Mapping[str, Login] | None = None,
    ) -> None:  # fmt: skip
        self._token = token
        self._logins = dict(logins or {})  # by source (a Space behind Gradio's login)
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._min_size, self._max_size = min_size, max_size
        self._fallback = fallback
        self._executor = executor
        self._spaces: dict[str, SpaceTransport] = {}
        self._continued: dict[str, Continued] = {}  # by URL, as _spaces
        self._hosts: dict[str, str] = {}
        self._opening: set[asyncio.Task[Any]] = set()
        self._cut = False

    async def open(self, src: str) -> SpaceClient:
        """A :class:`NativeClient` for ``src``, or the fallback's client when the
        Space's protocol is not one the transport speaks."""
        if self._cut:
            raise PoolClosedError("pool closed")
        task = asyncio.current_task()
        if task is not None:
            self._opening.add(task)
        try:
            url = await self._url(src)
            space = self._spaces.get(url)
            if space is None:
                space = self._spaces[url] = SpaceTransport(
                    url, token=self._token, connect_timeout_s=self._connect_timeout_s,
                    read_timeout_s=self._read_timeout_s, min_size=self._min_size,
                    max_size=self._max_size, verify=shared_ssl_context(),
                    login=self._logins.get(src),
                )  # fmt: skip
            try:
                app = await space.load()
            except ProtocolNotSupported:
                return await self._fallback.open(src)
            return NativeClient(space, app, self._continued.setdefault(url, Continued()))
        finally:
            if task is not None:
                self._opening.discard(task)

    async def _url(self, src: str) -> str:
        """A URL as given; a Hub id's host, asked once (``huggingface_hub.space_info``
        as gradio_client does, in a worker thread) with its runtime stage checked."""
        if src.startswith(("http://", "https://")):
            return src
        if src not in self._hosts:
            loop = asyncio.get_running_loop()
            self._hosts[src] = await loop.run_in_executor(self._executor, self._hub_host, src)
        return self._hosts[src]

    def _hub_host(self, space_id: str) -> str:
        import huggingface_hub

        info = huggingface_hub.space_info(space_id, token=self._token)
        stage = str(getattr(getattr(info, "runtime", None), "stage", "") or "")
        if stage in {"NO_APP_FILE", "CONFIG_ERROR", "BUILD_ERROR", "RUNTIME_ERROR", "PAUSED"}:
            raise ValueError(f"The current space is in the invalid state: {stage}.")
        if not info.host:
            raise ValueError(f"Could not find Space: {space_id}.")
        return str(info.host)

    def cut_opening(self) -> None:
        """Fail every connection being opened at once, and refuse new ones."""
        self._cut = True
        for task in list(self._opening):
            task.cancel()
        self._fallback.cut_opening()

    async def aclose(self) -> None:
        """Close every Space's HTTP client (after the connections are closed)."""
        spaces, self._spaces = list(self._spaces.values()), {}
        for space in spaces:
            with contextlib.suppress(Exception):
                await space.aclose()
        await self._fallback.aclose()
