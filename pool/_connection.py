"""One pooled connection: a ``gradio_client.Client`` plus the pool's bookkeeping.

A connection is exclusive to one request while leased. Opening and closing are
blocking (gradio_client is synchronous) and always run in worker threads.
"""

from __future__ import annotations

import enum
import functools
import itertools
import os
import ssl
import time
from collections.abc import Callable
from typing import Any

import httpx

_ids = itertools.count(1)

ClientFactory = Callable[[str], Any]
"""Opens a ``gradio_client.Client`` (or a compatible object) for a source URL or id."""


class ConnState(enum.Enum):
    IDLE = "idle"  # ready, waiting in the Space's idle list
    LEASED = "leased"  # exclusive to one request
    CLOSED = "closed"  # closed or being closed; never handed out again


class Connection:
    """A Client with its Space, generation, probe failures and timestamps."""

    __slots__ = (
        "app_id",
        "cancelling",
        "client",
        "created_at",
        "failures",
        "generation",
        "id",
        "last_used",
        "state",
        "used_by",
    )

    def __init__(self, client: Any, generation: int) -> None:
        self.id = next(_ids)
        self.client = client
        config = getattr(client, "config", None) or {}
        self.app_id: object = config.get("app_id")
        self.generation = generation
        self.created_at = self.last_used = time.monotonic()
        self.failures = 0
        self.state = ConnState.IDLE
        self.used_by: str | None = None
        # Upstream cancels of jobs not yet named by the Space; closing waits for them.
        self.cancelling: list[Any] = []

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

    def probe_url(self) -> str:
        """The cheap ``app_id`` endpoint of this connection's Space."""
        prefixed = str(getattr(self.client, "src_prefixed", "") or self.client.src)
        return prefixed.rstrip("/") + "/app_id"


def quiet_gradio_env() -> None:
    """No telemetry, no implicit token (GRADIO_FACTS.md)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """One TLS context for every connection.

    gradio_client passes ``verify=<bool>`` to each httpx call, which makes httpx load
    the CA bundle again for every request (30 % of a busy pool's CPU, and most of its
    memory, in scripts/bench). A context object is used as given. Honours
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` as httpx does.
    """
    cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    if cafile or capath:
        return ssl.create_default_context(cafile=cafile, capath=capath)
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def gradio_factory(
    *, token: str | None, connect_timeout_s: float, read_timeout_s: float, max_workers: int
) -> ClientFactory:
    """The default factory: a quiet Client with bounded threads and timeouts."""

    def open_client(src: str) -> Any:
        from gradio_client import Client

        return Client(
            src,
            token=token,
            max_workers=max_workers,
            verbose=False,
            download_files=False,
            analytics_enabled=False,
            ssl_verify=shared_ssl_context(),
            httpx_kwargs={"timeout": httpx.Timeout(connect_timeout_s, read=read_timeout_s)},
        )

    return open_client


def close_client(client: Any) -> None:
    """Really free a Client: stop the heartbeat and shut its executors down.

    ``Client.close()`` joins the heartbeat thread for up to 1 s, but that thread only
    notices the kill flag on the server's next ping, so joining buys nothing: set the
    flag (the thread exits by itself within one ping interval) and move on.
    """
    try:
        kill = getattr(client, "_kill_heartbeat", None)
        if kill is not None:
            kill.set()
        elif (close := getattr(client, "close", None)) is not None:
            close()
    finally:
        for name in ("executor", "helper_executor", "stream_executor"):
            executor = getattr(client, name, None)
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)
