"""Who a call is made for, above its email: a *consumer* such as a service's API key.

A deployment shared by several teams gives each its own key (app/_keys.py); the key
is a consumer with a concurrency limit of its own, and its users (emails) are its
own too. Both follow the call without being passed down every layer: the caller
(the HTTP service, once it has checked the key) sets :data:`CURRENT` for the task
that makes the call, and asyncio copies it into every task that call starts:

* admission (:func:`admission_consumers`) asks for the key's resource with the
  call's other slots, all at once (``consumer:key:<id>``, whose limit the key's
  ``max_concurrent`` sets in the coordinator), and the user's slot is the user's
  *within the key*; a keyed caller without an email is limited by the key alone;
* an email is hashed within its consumer's scope (:func:`scoped`): the same email
  sent with two keys is two users, so one team's users cannot exhaust another's;
* traces and usage name the consumer (``name``), never its secret.

With no consumer set (the library used directly, or the service's shared
``POOL_API_TOKEN``) nothing changes: ``consumer:<user>``, or the one
``consumer:anonymous`` of every caller without an email.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

CONSUMER_PREFIX = "consumer:"
"""Admission's private resources (pool/admission/_rule.py): one consumer's own."""
ANONYMOUS = "anonymous"
"""The user every caller without an email counts as where one is needed: admission's
``consumer:anonymous`` (``POOL_ANONYMOUS_MAX_CONCURRENT``) and the per-user bounds of
pool/_holdings.py. No keyed hash (16 hex digits) can be it."""


@dataclass(frozen=True)
class Consumer:
    """A consumer of the pool: ``name`` (shown), ``key_id`` (its admission resource and
    the scope of its users' hashes), ``priority`` (its calls' class when they ask none)."""

    name: str
    key_id: str
    priority: str | None = None

    @property
    def resource(self) -> str:
        return f"{CONSUMER_PREFIX}key:{self.key_id}"


CURRENT: ContextVar[Consumer | None] = ContextVar("spacepool_consumer", default=None)
"""The consumer of the calls made in this context (None: no consumer)."""


def current() -> Consumer | None:
    return CURRENT.get()


def admission_consumers(user: str | None) -> list[str]:
    """The private resources a call of ``user`` (a keyed hash, None if anonymous) needs,
    besides its Space's and the global one (see the module docstring)."""
    consumer = CURRENT.get()
    if consumer is None:
        return [CONSUMER_PREFIX + (user or ANONYMOUS)]
    return [consumer.resource] if user is None else [consumer.resource, CONSUMER_PREFIX + user]


def scoped(email: str) -> str:
    """``email`` as hashed within the current consumer (itself without one)."""
    consumer = CURRENT.get()
    return email if consumer is None else f"{consumer.key_id}/{email}"
