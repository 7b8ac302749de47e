"""Pooled connections on the native transport (:mod:`pool.transport`).

A native connection is a :class:`NativeClient`: the Space's one
:class:`~pool.transport.SpaceTransport` (shared by all its connections) and, per lease,
one :class:`~pool.transport.Session` — made on first use and retired when the
connection is returned (``reset_session``), so each lease starts with a fresh
``session_hash``. Opening one costs a ``gradio_api/app_id`` request once the Space's
config is known; closing one ends its sessions' tasks. No thread anywhere.

:class:`NativeFactory` opens them, and falls back to a ``gradio_client.Client``
(:mod:`pool._legacy`) for a Space whose protocol the transport does not speak.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Any

from ._exceptions import PoolClosedError
from ._legacy import GradioFactory
from ._tls import shared_ssl_context
from .transport import Affinity, AppInfo, Call, ProtocolNotSupported, Session, SpaceTransport


class NativeClient:
    """One pooled connection on the native transport (the ``Connection.client``)."""

    stream_open = False  # a returned connection never waits for a stream to settle

    def __init__(self, space: SpaceTransport, app: AppInfo) -> None:
        self.transport = space
        self.app = app
        self.config = app.config
        self.src = space.src
        self.src_prefixed = app.prefixed
        self._session: Session | None = None
        self._retired: set[asyncio.Task[None]] = set()

    @property
    def session(self) -> Session:
        """The current lease's session (made on first use)."""
        if self._session is None or self._session.closed:
            self._session = Session(self.transport, self.app)
        return self._session

    @property
    def affinity(self) -> Affinity | None:
        """The current session's replica cookies (None before a session was made)."""
        return self._session.affinity if self._session is not None else None

    def use_session(self, session_hash: str, affinity: Affinity | None = None) -> Session:
        """Continue a known ``session_hash`` (its ``gr.State``) on this connection, on
        the replica ``affinity``'s cookies reach."""
        self.reset_session()
        self._session = Session(self.transport, self.app, session_hash, affinity)
        return self._session

    def reset_session(self) -> None:
        """Retire the current session (closed in the background): the next lease
        gets a fresh ``session_hash``, so no ``gr.State`` crosses users."""
        old, self._session = self._session, None
        if old is not None:
            task = asyncio.get_running_loop().create_task(old.aclose())
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

    def stop_streams(self) -> None:
        """Close the current session's data stream and heartbeat at once (a fenced
        lease: its jobs must not go on at the Space)."""
        if self._session is not None:
            self._session.stop_streams()

    def submit(
        self, api_name: str | None, args: tuple[Any, ...], kwargs: Mapping[str, Any],
        headers: Mapping[str, str] | None, keep: int,
    ) -> Call:  # fmt: skip
        return self.session.submit(api_name, args, kwargs, headers=headers, keep=keep)

    def view_api(self, return_format: str = "dict", print_info: bool = False) -> dict[str, Any]:
        """``Client.view_api(return_format="dict")``'s dict."""
        return self.app.view_api()

    async def aclose(self) -> None:
        """End the session's reader, heartbeat and calls; wait for retired ones."""
        self.reset_session()
        while self._retired:
            await asyncio.gather(*list(self._retired), return_exceptions=True)


class NativeFactory:
    """Opens native connections; one :class:`SpaceTransport` per Space source."""

    def __init__(
        self, *, token: str | None, connect_timeout_s: float, read_timeout_s: float,
        min_size: int, max_size: int, fallback: GradioFactory, executor: Executor,
    ) -> None:  # fmt: skip
        self._token = token
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._min_size, self._max_size = min_size, max_size
        self._fallback = fallback
        self._executor = executor
        self._spaces: dict[str, SpaceTransport] = {}
        self._hosts: dict[str, str] = {}
        self._opening: set[asyncio.Task[Any]] = set()
        self._cut = False

    def __call__(self, src: str) -> Any:
        """The blocking form (a fallback Client), for callers that cannot await."""
        return self._fallback(src)

    async def aopen(self, src: str) -> Any:
        """A :class:`NativeClient` for ``src``, or a fallback ``gradio_client.Client``
        when the Space's protocol is not one the transport speaks."""
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
                )  # fmt: skip
            try:
                app = await space.load()
            except ProtocolNotSupported:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self._executor, self._fallback, src)
            return NativeClient(space, app)
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
