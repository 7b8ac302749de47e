"""Open SSE streams per caller, bounded per process (issue 38, F12).

A stream holds a task, a socket and a share of the event loop for as long as its client
keeps it open: without a bound, one caller (one key's user, or its anonymous callers)
opens them by the thousand. Each identity — the whole (key, user) of pool/_consumer.py —
holds at most ``POOL_MAX_STREAMS_PER_CALLER`` open at once in one process: every SSE
answer — job events, the front's data streams, heartbeats and REST results, and streamed
predicts (counted from their request, queued or running). Beyond, the stream is refused
before it starts: ``429 too_many_streams`` with ``Retry-After``.

A stream is given back however it ends: exhausted, failed, closed, or never started at
all (a client gone before the first byte: its response is dropped unread, and the
holder's finalizer gives the stream back), so no caller's count can leak.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Generic, TypeVar

from fastapi import Request

from pool import UserLimitReached, get_pool
from pool.admission import current as current_consumer
from pool.admission import identity

from ._services import services_of

T = TypeVar("T")
_RETRY_AFTER_S = 5.0


# An idle SSE stream sends a keepalive this often (gradio/utils.py get_heartbeat_rate).
KEEPALIVE_S = 15.0


class StreamCaps:
    """The open streams of each identity in this process (plain methods: no await)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}

    def take(self, who: str) -> Held:
        """One more stream of ``who`` (UserLimitReached, 429, at the limit): given back
        by the returned :class:`Held`."""
        held = self._open.get(who, 0)
        if held >= self.limit:
            raise UserLimitReached(
                f"this caller already holds {self.limit} open streams (the limit); close"
                " one or retry later", reason="too_many_streams", limit=self.limit,
                retry_after_s=_RETRY_AFTER_S,
            )  # fmt: skip
        self._open[who] = held + 1
        return Held(self, who)

    def give(self, who: str) -> None:
        held = self._open.get(who, 0) - 1
        if held > 0:
            self._open[who] = held
        else:
            self._open.pop(who, None)

    def open(self, who: str) -> int:
        """``who``'s streams open now."""
        return self._open.get(who, 0)


class Held:
    """One stream taken from a :class:`StreamCaps`, given back exactly once."""

    def __init__(self, caps: StreamCaps | None, who: str) -> None:
        self._caps, self._who = caps, who

    def release(self) -> None:
        caps, self._caps = self._caps, None
        if caps is not None:
            caps.give(self._who)

    def __del__(self) -> None:  # dropped unreleased (a stream never started)
        self.release()

    def over(self, stream: AsyncIterator[T]) -> AsyncIterator[T]:
        """``stream``, counted until it ends, fails, is closed or is dropped unread."""
        return _Counted(self, stream)


class _Counted(Generic[T]):
    """An async iterator over ``stream`` that releases its :class:`Held` at its end."""

    def __init__(self, held: Held, stream: AsyncIterator[T]) -> None:
        self._held, self._stream = held, stream

    def __aiter__(self) -> _Counted[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self._stream.__anext__()
        except BaseException:  # StopAsyncIteration included: the stream is over
            self._held.release()
            raise

    async def aclose(self) -> None:
        self._held.release()
        close = getattr(self._stream, "aclose", None)
        if close is not None:
            await close()


def caller(email: str | None) -> str:
    """The identity a stream counts for: the key, and the user within it."""
    consumer = current_consumer()
    key = "" if consumer is None else consumer.key_id
    return f"{key}\n{identity(get_pool().hash_user(email))}"


def hold_stream(request: Request, email: str | None) -> Held:
    """One of the caller's open streams (UserLimitReached: too many); nothing counted
    when the app has no caps (a test app without the lifespan)."""
    caps = services_of(request).find(StreamCaps)
    if caps is None:
        return Held(None, "")
    return caps.take(caller(email))


def bounded(request: Request, email: str | None, stream: AsyncIterator[T]) -> AsyncIterator[T]:
    """``stream`` as one of the caller's open streams (UserLimitReached: too many)."""
    return hold_stream(request, email).over(stream)
