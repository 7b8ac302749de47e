"""Open SSE streams per caller, bounded per process (issue 38, F12).

A stream holds a task, a socket and a share of the event loop for as long as its client
keeps it open: without a bound, one caller (one key's user, or its anonymous callers)
opens them by the thousand. Each identity — the whole (key, user) of pool/_consumer.py —
holds at most ``POOL_MAX_STREAMS_PER_CALLER`` open at once in one process: job events,
the front's data streams and heartbeats (the streams a client may hold open without
end; a streamed predict and a front REST result end with their call). Beyond, the
stream is refused before it starts: ``429 too_many_streams`` with ``Retry-After``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeVar

from fastapi import Request

from pool import UserLimitReached, get_pool
from pool.admission import current as current_consumer
from pool.admission import identity

T = TypeVar("T")
_RETRY_AFTER_S = 5.0


class StreamCaps:
    """The open streams of each identity in this process (plain methods: no await)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}

    def take(self, who: str) -> None:
        """One more stream of ``who``; UserLimitReached (429) at the limit."""
        held = self._open.get(who, 0)
        if held >= self.limit:
            raise UserLimitReached(
                f"this caller already holds {self.limit} open streams (the limit); close"
                " one or retry later", reason="too_many_streams", limit=self.limit,
                retry_after_s=_RETRY_AFTER_S,
            )  # fmt: skip
        self._open[who] = held + 1

    def give(self, who: str) -> None:
        held = self._open.get(who, 0) - 1
        if held > 0:
            self._open[who] = held
        else:
            self._open.pop(who, None)

    async def held(self, who: str, stream: AsyncIterator[T]) -> AsyncIterator[T]:
        """``stream``, counted as ``who``'s until it ends (taken already: :meth:`take`)."""
        try:
            async for item in stream:
                yield item
        finally:
            self.give(who)


def caller(email: str | None) -> str:
    """The identity a stream counts for: the key, and the user within it."""
    consumer = current_consumer()
    key = "" if consumer is None else consumer.key_id
    return f"{key}\n{identity(get_pool().hash_user(email))}"


def bounded(request: Request, email: str | None, stream: AsyncIterator[T]) -> AsyncIterator[T]:
    """``stream`` as one of the caller's open streams (UserLimitReached: too many);
    unbounded when the app has no caps (a test app without the lifespan)."""
    caps: StreamCaps | None = getattr(request.app.state, "streams", None)
    if caps is None:
        return stream
    who = caller(email)
    caps.take(who)
    return caps.held(who, stream)
