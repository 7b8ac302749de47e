"""What a front session keeps in the coordinator's shared values beside its record and
mailbox (docs/gradio-front.md, "Several workers and hosts"): the joins handed to its
runner (``gfront:j:``), its cancel requests (``gfront:x:``), the REST calls not read yet
(``gfront:r:``) and the output files relayed to clients (``gfront:o:``, the trust
boundary's list, fleet-wide: :class:`Outputs`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from pool.admission import Consumer, SharedValues

from ..edge import Boundary

MAX_FORWARDS = 256  # events handed to a session's runner and not taken yet, at most
MAX_CANCELS = 64  # cancel requests of one session kept for the worker running the event
_MAX_LOOKUPS = 64  # output files of one request looked up in the fleet, at most


def output_key(path: str) -> str:
    return f"gfront:o:{hashlib.sha256(path.encode()).hexdigest()[:40]}"


def call_key(event_id: str) -> str:
    return f"gfront:r:{hashlib.sha256(event_id.encode()).hexdigest()[:40]}"


def joins_key(core: str) -> str:
    """The shared value of the events handed to the session's runner
    (:func:`app.gradio._handover.forward`)."""
    return f"gfront:j:{core}"


def cancels_key(core: str) -> str:
    """The shared value of the session's cancel requests (event ids, the latest last)."""
    return f"gfront:x:{core}"


def consumer_of(raw: Any) -> Consumer | None:
    """The consumer a handed-over event was joined for (ValueError: not one)."""
    if raw is None:
        return None
    name, key_id, priority = raw
    return Consumer(str(name), str(key_id), None if priority is None else str(priority))


def consumer_entry(consumer: Consumer | None) -> list[Any] | None:
    """``consumer`` as a handed-over event records it (:func:`consumer_of` reads it)."""
    return None if consumer is None else [consumer.name, consumer.key_id, consumer.priority]


def entries(raw: str | None) -> list[dict[str, Any]]:
    try:
        found = json.loads(raw) if raw else []
    except ValueError:
        return []
    return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def ids(raw: str | None) -> list[str]:
    try:
        found = json.loads(raw) if raw else []
    except ValueError:
        return []
    return [str(e) for e in found] if isinstance(found, list) else []


class Outputs:
    """The output files relayed to clients, known to every worker of the fleet: the
    trust boundary lets a client name back only those (app.edge._boundary)."""

    def __init__(self, values: Callable[[], SharedValues], boundary: Boundary) -> None:
        self._values = values
        self.boundary = boundary

    async def mark(self, paths: list[str]) -> None:
        """Output files relayed to a client, made known to every worker."""
        ttl_s = self.boundary.outputs_ttl_s
        for path in dict.fromkeys(paths):
            await self._values().put(output_key(path), "1", ttl_s)

    async def known(self, value: Any) -> None:
        """The output files named in a client's ``value`` that another worker relayed,
        noted here before the trust boundary checks it."""
        unknown = self.boundary.unknown_outputs(value)
        for path in dict.fromkeys(unknown[:_MAX_LOOKUPS]):
            if await self._values().get(output_key(path)) is not None:
                self.boundary.note_outputs([path])
