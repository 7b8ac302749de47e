"""What the Space says about a running call, as fields of the job and stream JSON.

``upstream_rank`` / ``upstream_queue_size`` / ``upstream_eta_s``: the call's place in the
Space's own queue (0 = next), how many wait in it and the Space's estimate, from
``UpstreamQueued``, shown until the Space starts the call; ``progress``: the latest
``gr.Progress`` bars (``[{"index", "length", "unit", "progress", "desc"}]``, the outer
bar first); ``log``: the latest ``gr.Info``/``gr.Warning`` (``{"level", "message",
"title"}``). Partials and the end have fields of their own.

Only changes are shown (:class:`UpstreamView`). A wait at the Space is shown whatever its
rank (issue 31): rank 0 is the next call, which may wait behind the Space's running
events (its own or another client's); every joined call gets one ``estimation``, so a
call the Space starts at once would show rank 0 for a few ms: a rank 0 is shown once
the Space has not started the call within :data:`RANK_ZERO_GRACE_S`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from pool import UpstreamEvent, UpstreamLog, UpstreamProgress, UpstreamQueued, UpstreamStarted

RANK_ZERO_GRACE_S = 0.3  # a call not started this long after its rank-0 estimation waits

_NOT_QUEUED: dict[str, Any] = {
    "upstream_rank": None, "upstream_queue_size": None, "upstream_eta_s": None
}  # fmt: skip


class UpstreamView:
    """What one call's caller was shown so far: the call's ``on_event``, handing each
    change to ``deliver`` (in order, one at a time).

    Every joined call gets an ``estimation`` (rank 0 when nothing is ahead), and one the
    Space can start at once gets ``process_starts`` a few ms later: a rank 0 is shown only
    if the Space has not started the call within ``grace_s`` (no flicker of "queued" on
    every call). Any rank above 0 is shown at once. :meth:`close` when the call ends."""

    def __init__(
        self, deliver: Callable[[dict[str, Any]], Awaitable[None]], *,
        grace_s: float = RANK_ZERO_GRACE_S,
    ) -> None:  # fmt: skip
        self.shown: dict[str, Any] = dict(_NOT_QUEUED)
        self._deliver = deliver
        self._grace_s = grace_s
        self._lock = asyncio.Lock()
        self._pending: UpstreamQueued | None = None  # a rank 0 waiting for its grace
        self._timer: asyncio.Task[None] | None = None

    async def __call__(self, event: UpstreamEvent) -> None:
        waiting = self.shown["upstream_rank"] is not None
        if isinstance(event, UpstreamQueued) and event.rank == 0 and not waiting:
            self._pending = event
            if self._timer is None:
                self._timer = asyncio.create_task(self._after_grace())
            return
        self.close()  # a later event supersedes a rank 0 not shown yet
        await self._show(event)

    async def _after_grace(self) -> None:
        await asyncio.sleep(self._grace_s)
        self._timer = None
        if (pending := self._pending) is not None:
            self._pending = None
            await self._show(pending)

    async def _show(self, event: UpstreamEvent) -> None:
        async with self._lock:
            fields = event_fields(event)
            if fields is None:
                return
            changed = {k: v for k, v in fields.items() if self.shown.get(k, object()) != v}
            self.shown.update(changed)
            if changed:
                await self._deliver(changed)

    def close(self) -> None:
        """Drop a rank 0 still in its grace (the call started, moved on or ended)."""
        self._pending = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def event_fields(event: UpstreamEvent) -> dict[str, Any] | None:
    """The fields ``event`` sets (None: it sets none)."""
    if isinstance(event, UpstreamQueued):
        return {"upstream_rank": event.rank, "upstream_queue_size": event.queue_size,
                "upstream_eta_s": event.eta_s}  # fmt: skip
    if isinstance(event, UpstreamStarted):
        return dict(_NOT_QUEUED)
    if isinstance(event, UpstreamProgress):
        return {"progress": [dataclasses.asdict(unit) for unit in event.units]}
    if isinstance(event, UpstreamLog):
        return {"log": {"level": event.level, "message": event.message, "title": event.title}}
    return None
