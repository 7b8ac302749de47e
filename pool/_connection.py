"""One pooled connection: the pool's bookkeeping around a client of one Space.

The client is a :class:`~pool._native.NativeClient` (the asyncio transport, a fresh
session per lease) or, as a fallback, a ``gradio_client.Client`` (:mod:`pool._legacy`).
A connection is exclusive to one request while leased. :meth:`Connection.submit`
starts a job on either and returns an object with the interface of
:class:`pool.transport.Call`; :meth:`Connection.aclose` frees either completely.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

from . import _legacy
from ._legacy import GradioFactory, StreamCutter, close_client, gradio_factory
from ._native import NativeClient
from ._threads import wait_ended
from ._tls import shared_ssl_context

_ids = itertools.count(1)
_CLOSE_WAIT_S = 3.0  # a fallback Client's threads end within ms once its sockets are cut
_log = logging.getLogger("spacepool")

ClientFactory = Callable[[str], Any]
"""Opens a ``gradio_client.Client`` (or a compatible object) for a source URL or id; a
factory with an ``aopen`` coroutine method (``NativeFactory``) is awaited instead."""


class ConnState(enum.Enum):
    IDLE = "idle"  # ready, waiting in the Space's idle list
    LEASED = "leased"  # exclusive to one request
    CLOSED = "closed"  # closed or being closed; never handed out again


class Connection:
    """A Client with its Space, generation, probe failures and timestamps."""

    __slots__ = (
        "app_id",
        "cancels",
        "client",
        "created_at",
        "failures",
        "generation",
        "id",
        "last_used",
        "state",
        "used_by",
    )

    def __init__(self, client: Any, generation: int, now: float) -> None:
        self.id = next(_ids)
        self.client = client
        config = getattr(client, "config", None) or {}
        self.app_id: object = config.get("app_id")
        self.generation = generation
        self.created_at = self.last_used = now
        self.failures = 0
        self.state = ConnState.IDLE
        self.used_by: str | None = None
        # Job cancels (``/cancel`` requests) still in flight: closing waits for them,
        # as cutting the connections would stop them reaching the Space.
        self.cancels: list[asyncio.Future[Any]] = []

    def is_idle_longer_than(self, seconds: float, now: float) -> bool:
        return self.state is ConnState.IDLE and now - self.last_used >= seconds

    def is_healthy(self, max_failures: int) -> bool:
        return self.failures < max_failures

    def api_names(self) -> list[str]:
        """The Space's public ``api_name`` values, with the leading slash."""
        names = []
        for dep in (getattr(self.client, "config", None) or {}).get("dependencies", []):
            name = dep.get("api_name")
            if name and dep.get("api_visibility") != "private":
                names.append("/" + name)
        return names

    def is_generator(self, api_name: str | None) -> bool:
        """Whether ``api_name`` is a generator endpoint (streams partial outputs), from
        the Space's config; True when the config does not say."""
        for dep in (getattr(self.client, "config", None) or {}).get("dependencies", []):
            if api_name is not None and "/" + str(dep.get("api_name")) == api_name:
                return bool((dep.get("types") or {}).get("generator", True))
        return True

    @property
    def native(self) -> bool:
        return isinstance(self.client, NativeClient)

    def submit(
        self, api_name: str | None, args: tuple[Any, ...], kwargs: Mapping[str, Any],
        headers: Mapping[str, str] | None, keep: int, executor: Executor,
    ) -> Any:  # fmt: skip
        """Start a job: a :class:`pool.transport.Call` or a fallback ``GradioJob``."""
        if isinstance(self.client, NativeClient):
            return self.client.submit(api_name, args, kwargs, headers, keep)
        return _legacy.submit(self.client, api_name, args, kwargs, headers, keep, executor)

    async def aclose(self, executor: Executor, space: str) -> None:
        """Free the client: a native one's sessions, or a Client's threads (cut)."""
        self.state = ConnState.CLOSED
        if isinstance(self.client, NativeClient):
            await self.client.aclose()
            return
        loop = asyncio.get_running_loop()
        threads = await loop.run_in_executor(executor, close_client, self.client)
        left = await wait_ended(threads, _CLOSE_WAIT_S)
        if left:  # still connecting: the connect timeout ends it
            _log.warning("space %s: %d thread(s) of a closed connection still running",
                         space, len(left))

    def probe_url(self) -> str:
        """The cheap ``app_id`` endpoint of this connection's Space."""
        prefixed = str(getattr(self.client, "src_prefixed", "") or self.client.src)
        return prefixed.rstrip("/") + "/app_id"

    def probe_headers(self) -> dict[str, str]:
        """The cookies that keep a probe on this connection's replica: the Space's home
        jar (native), or the Client's own cookies from its ``/config`` (fallback)."""
        if isinstance(self.client, NativeClient):
            return self.client.transport.home.headers(self.probe_url())
        cookies = getattr(self.client, "cookies", None) or {}
        return {"cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())} if cookies else {}


def quiet_gradio_env() -> None:
    """No telemetry, no implicit token (docs/hub.md, "Private Spaces": we send ours)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")


__all__ = [
    "ClientFactory",
    "ConnState",
    "Connection",
    "GradioFactory",
    "StreamCutter",
    "close_client",
    "gradio_factory",
    "quiet_gradio_env",
    "shared_ssl_context",
]
