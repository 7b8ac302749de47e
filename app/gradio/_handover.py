"""Joins handed to a session's runner: the events of one session run on one worker at a
time (one upstream session has one data stream), so a join that reaches another worker
while the runner has events is handed to it through the coordinator (``gfront:j:``:
the join body and the consumer — API key — it was joined for). The runner, woken by the
write (:meth:`FrontSession._watch`), builds the event from the body as its own join
(:func:`app.gradio._event_request.event_of`: the trust boundary and the secret guard)
and runs it under that consumer."""

from __future__ import annotations

import contextlib
import contextvars
import json
from typing import TYPE_CHECKING, Any

from pool import PoolError
from pool.admission import CURRENT, Consumer

from ..edge import GATE
from ._event_request import EventRequest, event_of
from ._fleet import MAX_FORWARDS, cancels_key, consumer_entry, consumer_of, entries, ids, joins_key
from ._front_errors import failure
from ._messages import completed_cancelled, completed_error

if TYPE_CHECKING:
    from ._front_session import FrontSession


async def forward(
    session: FrontSession, event: EventRequest, event_id: str, runner: str,
    consumer: Consumer | None,
) -> None:  # fmt: skip
    """Hand the event to ``runner``, the worker running the session's events now. Not
    handed over, it ends."""
    entry = {"to": runner, "event_id": event_id, "body": event.body,
             "front_root": event.front_root, "consumer": consumer_entry(consumer)}  # fmt: skip

    def add(raw: str | None) -> str:
        return json.dumps([*entries(raw), entry][-MAX_FORWARDS:])

    front = session.front
    try:
        await front.values().update(joins_key(session.core), add, front.shared_ttl_s)
    except PoolError as exc:
        session.outbox.publish(completed_error(event_id, failure(exc)))


async def take_forwarded(session: FrontSession) -> None:
    """Run the events other workers handed to this one (:func:`forward`)."""
    front, mine = session.front, list[dict[str, Any]]()

    def take(raw: str | None) -> str | None:
        nonlocal mine
        found = entries(raw)
        mine = [e for e in found if e.get("to") == front.worker]
        return json.dumps([e for e in found if e not in mine]) if mine else None

    await front.values().update(joins_key(session.core), take, front.shared_ttl_s)
    if not mine:
        return
    asked = ids(await front.values().get(cancels_key(session.core)))
    for entry in mine:
        event_id = str(entry.get("event_id"))
        if event_id in asked:  # cancelled before it ran
            session.outbox.publish(completed_cancelled(event_id))
            with contextlib.suppress(PoolError):
                await session.outbox.release(event_id, front.worker)
            continue
        try:
            consumer = consumer_of(entry.get("consumer"))
            joined = CURRENT.set(consumer)  # its files and user are its key's
            try:
                body = dict(entry.get("body") or {})
                event = await event_of(front.pool, front.outputs, session.scope, body,
                                       session.email, str(entry.get("front_root")))  # fmt: skip
            finally:
                CURRENT.reset(joined)
            runner = await session.outbox.claim(event_id, front.worker)
        except Exception as exc:
            session.outbox.publish(completed_error(event_id, failure(exc)))
            with contextlib.suppress(PoolError):
                await session.outbox.release(event_id, front.worker)
            continue
        if runner == front.worker:
            context = contextvars.copy_context()
            context.run(CURRENT.set, consumer)
            gate = None if consumer is None or front.gate_of is None else (
                front.gate_of(consumer.key_id))  # fmt: skip
            context.run(GATE.set, gate)
            session.run_here(event, event_id, context)
        else:
            await forward(session, event, event_id, runner, consumer)
