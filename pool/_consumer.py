"""Who a call is made for, above its email: a *consumer* such as a service's API key.

A deployment shared by several teams gives each its own key (app/teams/_keys.py); the key
is a consumer with a concurrency limit of its own, and its users (emails) are its
own too. Both follow the call without being passed down every layer: the caller
(the HTTP service, once it has checked the key) sets :data:`CURRENT` for the task
that makes the call, and asyncio copies it into every task that call starts:

* admission (:func:`admission_consumers`) asks for the key's resource with the
  call's other slots, all at once (``consumer:key:<id>``, whose limit the key's
  ``max_concurrent`` sets in the coordinator), and the user's slot is the user's
  *within the key*; a keyed caller without an email takes its key's anonymous slot;
* an email is hashed within its consumer's scope (:func:`scope`): the hash is of the
  length-prefixed pair (key id, email), never of a joined string, so the same email
  sent with two keys is two users and no email sent without a key (``"<key id>/bob"``
  included) is a key's user (issue 38);
* a keyed caller without an email is its key's anonymous user (:func:`anonymous`):
  each key has its own anonymous consumer (``consumer:anonymous:<key id>``, under
  ``POOL_ANONYMOUS_MAX_CONCURRENT`` each), holdings and sessions;
* every owner check compares a whole identity (:func:`identity`): a user's hash (which
  carries its key), else its key's anonymous user;
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


PSEUDONYMOUS: ContextVar[bool] = ContextVar("spacepool_pseudonymous", default=False)
"""Set for calls whose user is a pseudonym anyone can mint (the Gradio front's page
visitors, app/gradio/_visitors.py): such a call takes its consumer's anonymous slot as
well as its user's, so ``POOL_ANONYMOUS_MAX_CONCURRENT`` bounds all of them together while
each keeps its own user slot, pins and sessions."""


def admission_consumers(user: str | None) -> list[str]:
    """The private resources a call of ``user`` (a keyed hash, None if anonymous) needs,
    besides its Space's and the global one (see the module docstring)."""
    consumer = CURRENT.get()
    if consumer is None:
        needed = [CONSUMER_PREFIX + (user or ANONYMOUS)]
    else:
        needed = [consumer.resource, CONSUMER_PREFIX + (user or anonymous())]
    if user is not None and PSEUDONYMOUS.get():
        needed.append(CONSUMER_PREFIX + anonymous())
    return needed


def scope() -> str:
    """The scope an email is hashed within: the current consumer's key id ("" without
    one; a key id is never empty)."""
    consumer = CURRENT.get()
    return "" if consumer is None else consumer.key_id


def anonymous_of(key_id: str | None) -> str:
    """The anonymous user of key ``key_id`` (None: of the callers without a key). No
    keyed hash (16 hex digits) can be it."""
    return ANONYMOUS if key_id is None else f"{ANONYMOUS}:{key_id}"


def anonymous() -> str:
    """The anonymous user of the current consumer (:func:`anonymous_of`)."""
    consumer = CURRENT.get()
    return anonymous_of(None if consumer is None else consumer.key_id)


def identity(user: str | None) -> str:
    """The whole identity of a caller whose user is ``user`` (a keyed hash, None when
    anonymous) in the current context: what every owner check compares."""
    return user or anonymous()
