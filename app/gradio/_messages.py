"""The messages of one front session: the one place they are published, the one they
are read from — in the coordinator, so that any worker or host of the fleet reads them.

What a client's ``queue/data`` stream carries (gradio/routes.py ``queue_data``): every
message of the session's events, tagged by ``event_id``, in order, and the stream ends
(``close_stream``) once no event of the session is pending. An event is pending from its
join (:meth:`SessionMessages.expect`) to its ``process_completed`` — whoever sends that:
the Space, or the front for an event that never ran.

The session's *mailbox* is one shared value of the coordinator (``gfront:m:<session>``,
:class:`~pool.admission.SharedValues`: the SQLite file of a host's workers, or Redis
across hosts): its pending events and the messages not read yet. The worker running an
event appends its messages (:meth:`SessionMessages.publish`: in order, several at once
when they come faster than the store takes them); the worker holding the client's stream
(any worker) watches the value — woken by each write, the store's change signal, not
by polling — and takes what is there in one atomic update, which also settles which
message ends the stream (:meth:`SessionMessages.read`). One process alone is the same
mechanism on its own store (a write wakes the reader at once).

Bounded: a message is deleted once read; the mailbox expires ``ttl_s`` after its last
write or renewal (:meth:`SessionMessages.renew`, while the session is in use) and is
deleted when the session ends (:meth:`SessionMessages.discard`); at most
:data:`MAX_UNREAD` messages wait unread (the oldest progress messages are dropped past
it, never a completion).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from pool import PoolError
from pool.admission import SharedValues

from ..core import KEEPALIVE_S, Draining

_log = logging.getLogger("spacepool.app")
MAX_UNREAD = 4096  # messages of one session waiting for its stream, at most
RUNNER_TTL_S = 30.0  # a session's runner not renewed this long is gone (renewed each third)
_RETRY_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0)  # a write the store refused, tried again

Message = dict[str, Any]
Mark = Callable[[list[str]], Awaitable[None]]
Item = tuple[Message, bool]  # a message, and whether the stream ends after it


def completed_error(event_id: str, message: str) -> Message:
    """The message that ends an event with an error, as a Space sends it (gradio_client
    raises ``AppError(message)``)."""
    return {"msg": "process_completed", "event_id": event_id, "success": False,
            "output": {"error": message}}  # fmt: skip


def completed_cancelled(event_id: str) -> Message:
    """The message that ends a cancelled event, as a Space sends it (gradio/routes.py
    ``cancel_event``: an empty output)."""
    return {"msg": "process_completed", "event_id": event_id, "success": True, "output": {}}


def mailbox_key(core: str) -> str:
    """The shared value holding the messages of the core session ``core``."""
    return f"gfront:m:{core}"


def _load(raw: str | None) -> tuple[list[str], list[Message]]:
    box = _box(raw)
    return [str(e) for e in box["pending"]], list(box["msgs"])


def _box(raw: str | None) -> dict[str, Any]:
    """The mailbox: ``pending`` events, unread ``msgs``, the ``runner`` (see
    :meth:`SessionMessages.claim`) if any."""
    try:
        box = json.loads(raw) if raw is not None else {}
        if isinstance(box, dict) and isinstance(box.get("pending"), list) and isinstance(
            box.get("msgs"), list
        ):
            return box
    except ValueError:
        pass
    return {"pending": [], "msgs": []}


def _dump(pending: list[str], msgs: list[Message], runner: Any = None) -> str:
    box: dict[str, Any] = {"pending": pending, "msgs": msgs}
    if runner:
        box["runner"] = runner
    return json.dumps(box, separators=(",", ":"))


def _keep(raw: str | None, pending: list[str], msgs: list[Message]) -> str:
    """``pending`` and ``msgs`` stored, the rest of the mailbox as it was."""
    return json.dumps({**_box(raw), "pending": pending, "msgs": msgs}, separators=(",", ":"))


def _runner(box: dict[str, Any]) -> dict[str, Any] | None:
    runner = box.get("runner")
    try:
        return {"worker": str(runner["worker"]), "events": [str(e) for e in runner["events"]],
                "until": float(runner["until"])} if runner else None  # fmt: skip
    except (KeyError, TypeError, ValueError):
        return None


def _bounded(msgs: list[Message]) -> list[Message]:
    """At most :data:`MAX_UNREAD`: the oldest messages that end nothing dropped first."""
    extra = len(msgs) - MAX_UNREAD
    if extra <= 0:
        return msgs
    kept: list[Message] = []
    for msg in msgs:
        if extra > 0 and msg.get("msg") != "process_completed":
            extra -= 1
            continue
        kept.append(msg)
    return kept


def _taken(pending: list[str], msgs: list[Message]) -> tuple[list[str], list[Item]]:
    """``msgs`` read in order: each ``process_completed`` settles its event; the stream
    ends after one that leaves no event pending."""
    left, items = list(pending), []
    for msg in msgs:
        last = False
        if msg.get("msg") == "process_completed":
            event_id = str(msg.get("event_id"))
            if event_id in left:
                left.remove(event_id)
            last = not left
        items.append((msg, last))
    return left, items


class SessionMessages:
    """The mailbox of one session (module docstring); ``values``: the coordinator's."""

    def __init__(
        self, values: Callable[[], SharedValues], core: str, ttl_s: float, mark: Mark
    ) -> None:
        self._values = values
        self.key = mailbox_key(core)
        self.ttl_s = ttl_s
        self._mark = mark
        self._outgoing: list[tuple[Message, Sequence[str]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._closed = False
        self._sealed = False

    async def expect(self, event_id: str, worker: str) -> str:
        """An event joined: the session's stream stays open until it completes (stored
        before the join is answered: a stream on another worker knows it at once); and
        :meth:`claim`'s answer, in the same write."""
        return await self.claim(event_id, worker, joined=True)

    async def claim(self, event_id: str, worker: str, *, joined: bool = False) -> str:
        """The worker to run the event: ``worker`` when no other runs events of this
        session now (it becomes the session's *runner* until its last one ends:
        :meth:`release`), else that runner (the event counted as one of its own until
        it takes it) — one upstream session has one data stream, so its events run in
        one process at a time. A runner not renewed for
        :data:`RUNNER_TTL_S` is gone (its worker died): its events are completed with an
        error, and ``worker`` takes over."""
        chosen = worker

        def take(raw: str | None) -> str:
            nonlocal chosen
            box = _box(raw)
            pending, msgs = [str(e) for e in box["pending"]], list(box["msgs"])
            if joined:
                pending.append(event_id)
            runner, now = _runner(box), time.time()
            if runner and runner["worker"] != worker and runner["events"]:
                if runner["until"] > now:  # handed to the runner: one of its events
                    chosen = str(runner["worker"])
                    if event_id not in runner["events"]:
                        runner["events"].append(event_id)
                    return _dump(pending, msgs, runner)
                msgs += [completed_error(e, "the worker running it is gone")
                         for e in runner["events"] if e in pending]  # fmt: skip
                runner = None
            chosen = worker
            events = [*(runner["events"] if runner else []), event_id]
            return _dump(pending, msgs, {"worker": worker, "events": events,
                                         "until": now + RUNNER_TTL_S})  # fmt: skip

        await self._values().update(self.key, take, self.ttl_s)
        return chosen

    async def refuse(self, event_id: str, message: str) -> None:
        """An event refused as it joined (its key's quota): named and completed with the
        error in one write, so that the session's stream delivers it as a Space's own
        error (gradio_client ``AppError(message)``, @gradio/client's error status)."""

        def add(raw: str | None) -> str:
            box = _box(raw)
            pending = [*(str(e) for e in box["pending"]), event_id]
            msgs = [*box["msgs"], completed_error(event_id, message)]
            return _dump(pending, msgs, _runner(box))

        await self._values().update(self.key, add, self.ttl_s)

    async def release(self, event_id: str, worker: str) -> None:
        """The event, run by ``worker``, ended: the session has no runner after its
        last one."""

        def drop(raw: str | None) -> str | None:
            box = _box(raw)
            runner = _runner(box)
            if not runner or runner["worker"] != worker or event_id not in runner["events"]:
                return None
            events = [e for e in runner["events"] if e != event_id]
            return _dump(box["pending"], box["msgs"], {**runner, "events": events} if events
                         else None)  # fmt: skip

        await self._values().update(self.key, drop, self.ttl_s)

    async def keep_running(self, worker: str) -> None:
        """``worker`` runs events of the session still: its claim lasts another
        :data:`RUNNER_TTL_S`."""

        def renew(raw: str | None) -> str | None:
            box = _box(raw)
            runner = _runner(box)
            if not runner or runner["worker"] != worker:
                return None
            return _dump(box["pending"], box["msgs"], {**runner, "until": time.time()
                                                       + RUNNER_TTL_S})  # fmt: skip

        await self._values().update(self.key, renew, self.ttl_s)

    def publish(self, msg: Message, files: Sequence[str] = ()) -> None:
        """A message for the client (``event_id`` set), after those published before:
        written by this session's one writer task, in order. ``files``: the Space's
        output files it names, made known to the fleet (``mark``) before the message
        is readable, so that a client may name them back to any worker at once."""
        if self._closed or self._sealed:
            return
        self._outgoing.append((msg, files))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        failures = 0
        while self._outgoing and not self._closed:
            batch = [msg for msg, _ in self._outgoing]
            files = [path for _, paths in self._outgoing for path in paths]

            def append(raw: str | None, batch: list[Message] = batch) -> str:
                pending, msgs = _load(raw)
                return _keep(raw, pending, _bounded([*msgs, *batch]))

            try:
                if files:
                    await self._mark(files)
                await self._values().update(self.key, append, self.ttl_s)
            except PoolError:  # the coordinator out of reach: try again, then give up
                if failures >= len(_RETRY_S):
                    _log.warning("Gradio front: %d messages of a session were lost (the"
                                 " coordinator is out of reach)", len(batch))  # fmt: skip
                    del self._outgoing[: len(batch)]
                    failures = 0
                    continue
                await asyncio.sleep(_RETRY_S[failures])
                failures += 1
                continue
            failures = 0
            del self._outgoing[: len(batch)]

    async def _take(self) -> tuple[list[Item], bool]:
        """What is in the mailbox, taken in one atomic update; and whether no event is
        pending after it."""
        taken: list[Item] = []
        idle = False

        def take(raw: str | None) -> str | None:
            nonlocal taken, idle
            pending, msgs = _load(raw)
            if not msgs:
                taken, idle = [], not pending
                return None  # nothing to take: nothing written
            left, taken = _taken(pending, msgs)
            idle = not left
            return _keep(raw, left, [])

        await self._values().update(self.key, take, self.ttl_s)
        return taken, idle

    async def read(self, draining: Draining) -> AsyncIterator[Item | None]:
        """Each message as it comes, with whether the stream ends after it; None after
        :data:`KEEPALIVE_S` without one (the stream sends its keepalive). Once the process
        drains (app/core/_draining.py) the read ends as soon as no event is pending: the stream
        says ``close_stream`` and the client opens its next one on another worker (a
        client may hold an idle stream open for ever: it would hold the shutdown)."""
        quiet_since = time.monotonic()
        async with self._values().watch(self.key) as changed:
            while True:
                try:
                    items, idle = await self._take()
                except PoolError:  # out of reach: look again after the next wake-up
                    items, idle = [], False
                for item in items:
                    yield item
                if items:
                    quiet_since = time.monotonic()
                    continue
                if idle and draining.is_set():
                    return
                left = KEEPALIVE_S - (time.monotonic() - quiet_since)
                if left <= 0 or not await draining.or_changed(changed, left):
                    yield None
                    quiet_since = time.monotonic()
                    with contextlib.suppress(PoolError):
                        await self._settle_gone_runner()

    async def _settle_gone_runner(self) -> None:
        """A runner not renewed for :data:`RUNNER_TTL_S` is gone (its worker died): its
        events are completed with an error (seen by the stream, every keepalive)."""

        def settle(raw: str | None) -> str | None:
            box = _box(raw)
            runner = _runner(box)
            if not runner or runner["until"] > time.time():
                return None
            pending, msgs = [str(e) for e in box["pending"]], list(box["msgs"])
            msgs += [completed_error(e, "the worker running it is gone")
                     for e in runner["events"] if e in pending]  # fmt: skip
            return _dump(pending, msgs)

        await self._values().update(self.key, settle, self.ttl_s)

    def seal(self) -> None:
        """Nothing published from now on is sent (what was is written still)."""
        self._sealed = True

    async def flush(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until what was published is written."""
        writer = self._writer
        if writer is not None and not writer.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(writer), timeout_s)

    async def renew(self) -> None:
        """The session is in use: the mailbox lasts another ``ttl_s`` (one write)."""
        await self._values().update(self.key, lambda raw: raw, self.ttl_s)

    async def discard(self) -> None:
        """The session ended: nothing more is published here, the mailbox is deleted
        (its unread messages dropped)."""
        self._closed = True
        self._outgoing.clear()
        writer = self._writer
        if writer is not None and not writer.done():
            writer.cancel()
            with contextlib.suppress(BaseException):
                await writer
        with contextlib.suppress(PoolError):
            await self._values().delete(self.key)
