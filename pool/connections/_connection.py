"""One pooled connection: the pool's bookkeeping around a client of one Space.

The client is a :class:`~pool.transport.SpaceClient` — the native transport's or the
fallback's; this layer never asks which. A connection is exclusive to one request
while leased.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import itertools
import json
from typing import Any

from ..transport import SpaceClient

_ids = itertools.count(1)


class ConnState(enum.Enum):
    IDLE = "idle"  # ready, waiting in the Space's idle list
    LEASED = "leased"  # exclusive to one request
    CLOSED = "closed"  # closed or being closed; never handed out again


class Connection:
    """A client with its generation, probe failures and timestamps."""

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

    def __init__(self, client: SpaceClient, generation: int, now: float) -> None:
        self.id = next(_ids)
        self.client = client
        self.app_id: object = client.app_id
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

    def probe_url(self) -> str:
        """The cheap ``app_id`` endpoint of this connection's Space."""
        return self.client.root + "app_id"

    def signatures(self) -> dict[str, str]:
        """``api_name`` → a digest of its parameters and outputs (``view_api``'s dict,
        no network); empty when the client cannot say. Two Spaces whose digests agree
        serve one app (pool/routing/_apps.py)."""
        try:
            named = dict(self.client.view_api().get("named_endpoints") or {})
        except Exception:
            return {}
        signatures = {}
        for name, endpoint in named.items():
            shape = {"parameters": endpoint.get("parameters"), "returns": endpoint.get("returns")}
            text = json.dumps(shape, sort_keys=True, default=str)
            signatures[str(name)] = hashlib.sha256(text.encode()).hexdigest()[:16]
        return signatures

    async def aclose(self) -> None:
        """Free the client completely."""
        self.state = ConnState.CLOSED
        await self.client.aclose()
