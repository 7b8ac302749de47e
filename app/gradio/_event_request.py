"""A ``queue/join`` body made into an event: the function, the data, the other fields,
checked (the trust boundary, the secret guard), on the worker that got the join or on
the session's runner it was handed to (app/gradio/_handover.py): one function,
:func:`event_of`, which both call."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from pool import InvalidRequest, Pool, check_outbound

from ._fleet import Outputs
from ._space_view import served


@dataclass(frozen=True)
class EventRequest:
    """One ``queue/join`` as the client sent it, resolved against the served config."""

    api_name: str | None
    fn_index: int  # in the config the client was served
    data: list[Any]
    email: str | None
    queue_timeout_s: float
    front_root: str  # the service's address of the client's scope
    # The rest of the join body, passed to the Space as sent (``event_data``,
    # ``trigger_id``, ...: gradio/data_classes.py ``PredictBody``).
    fields: dict[str, Any] = field(default_factory=dict)
    # The join body as the client sent it: what another worker builds the event from
    # when this one is not the session's runner (:meth:`FrontSession.join`).
    body: dict[str, Any] = field(default_factory=dict)


# The join body's fields other than data, fn_index and session_hash, as a Space takes
# them (gradio/data_classes.py ``PredictBody``), each with the type it must have; passed
# to the Space as sent. (``event_id`` is the Space's to give; ``batched`` its own queue's.)
_FIELDS: dict[str, type] = {
    "event_data": object,
    "trigger_id": int,
    "oauth_token": str,  # the caller's, for an endpoint taking a gr.OAuthToken
    "simple_format": bool,
}


def _fields(body: dict[str, Any]) -> dict[str, Any]:
    """The rest of the join body (:data:`_FIELDS`); 422 for a field of the wrong type."""
    fields: dict[str, Any] = {}
    for name, kind in _FIELDS.items():
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise InvalidRequest(f"{name} must be {kind.__name__}")
        fields[name] = value
    return fields


async def _screened(pool: Pool, scope: str | None, payload: list[Any]) -> None:
    """The outbound secret guard of the scope's Spaces (as each event's lease applies
    it), before the event is queued: a refusal is the join's 4xx."""
    guard = pool.settings.secret_guard
    names = [scope] if scope is not None else list(pool.spaces)
    if guard == "on" or (guard == "auto" and any(pool.spaces[n].spec.is_hub for n in names)):
        await asyncio.to_thread(check_outbound, tuple(payload), {})


async def event_of(
    pool: Pool, outputs: Outputs, scope: str | None, body: dict[str, Any], email: str | None,
    front_root: str,
) -> EventRequest:  # fmt: skip
    """The event of a join ``body`` (checked: the function, the data, the other fields,
    the trust boundary, the secret guard)."""
    _, app = await served(pool, scope)
    fn_index, data = body.get("fn_index"), body.get("data")
    if not isinstance(fn_index, int) or fn_index not in app.endpoints:
        raise InvalidRequest(f"no function {fn_index!r} in this app")
    if not isinstance(data, list):
        raise InvalidRequest("data must be a list")
    fields = _fields(body)
    await outputs.known(data)  # relayed by another worker of the fleet, perhaps
    data = outputs.boundary.values(data, "data")
    await _screened(pool, scope, [*data, *fields.values()])
    endpoint = app.endpoints[fn_index]
    return EventRequest(
        api_name=endpoint.api_name if endpoint.public else None, fn_index=fn_index, data=data,
        email=email, queue_timeout_s=pool.settings.queue_timeout_s,
        front_root=front_root, fields=fields, body=body,
    )  # fmt: skip
