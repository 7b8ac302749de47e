"""``Idempotency-Key`` on ``POST /api/jobs``: a retried submission gets the same job.

A client whose response was lost retries with the same key; within the job retention
time the same key from the same caller (bearer token and ``email``) names the job the
first request created, so the predict does not run twice (the semantics of
draft-ietf-httpapi-idempotency-key-header). Neither the key nor the caller is stored in
clear: the entry's name is ``idem:<hash of both>``, in the coordinator's shared values,
so that workers agree. Each change of an entry is one compare-and-set::

    (no entry) ──reserve──► creating ──accept──► accepted     (TTL: the job retention)
         ▲                   │ (TTL CREATING_TTL_S)
         └──────release──────┘  (the submission was refused: jobs_full, an error, ...)

* ``creating``: one request holds the key while it creates its job. Another request
  with the key is told to come back (409 ``idempotency_key_in_use``, the API) — unless
  the job exists already (created, not yet marked accepted): then it is a replay. A
  worker that dies here holds the key for ``CREATING_TTL_S`` at most.
* ``accepted``: the job exists; the same key and request get its id.
* ``release`` replaces the request's own ``creating`` entry by a short-lived tombstone
  that counts as no entry, so that a retry creates the job. Not ``values.delete``:
  that is unconditional, and an entry past its TTL may be another request's by then.

Every entry holds the request's *fingerprint*: a hash of the validated body as canonical
JSON (defaults filled in, keys sorted) and of the bytes of its uploaded file parts. The
same key with another fingerprint is :class:`~app.core._errors.IdempotencyKeyReused` (422),
whatever the entry's state. (A file given by URL counts by its URL: the bytes behind it
may change between a request and its retry.)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pool.admission import SharedValues

from ..calls import CheckedCall
from ..core import IdempotencyKeyReused
from ..edge import PredictRequest, is_file_form

PREFIX = "idem:"
MAX_KEY_CHARS = 255
CREATING_TTL_S = 30.0
"""How long a reservation outlives a worker that died while creating its job."""

_RELEASED = json.dumps({"state": "released"})
_RELEASED_TTL_S = 1.0
_LIVE = frozenset({"creating", "accepted"})
_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class Held:
    """The key's entry as :func:`reserve` left it."""

    name: str  # the entry's key in the shared values
    job_id: str  # the job the key names (this request's when ``mine``)
    fingerprint: str  # "" for an entry written before fingerprints (not compared)
    mine: bool  # this request reserved the key: it creates the job
    accepted: bool  # the job was created (``accept`` ran)

    def _text(self, state: str) -> str:
        return json.dumps({"job": self.job_id, "fp": self.fingerprint, "state": state})


def caller_of(authorization: str, user: str | None) -> str:
    """Who sent the key: the hash of the ``Authorization`` header and the hashed user."""
    token = hashlib.sha256(authorization.encode()).hexdigest()
    return f"{token}:{user or ''}"


def _name(caller: str, key: str) -> str:
    return PREFIX + hashlib.sha256(f"{caller}\0{key}".encode()).hexdigest()


def fingerprint(body: PredictRequest, file_digests: Sequence[str] = ()) -> str:
    """The request's fingerprint: its validated body as canonical JSON, then the SHA-256
    of each uploaded file part in argument order."""
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode())
    for file_digest in file_digests:
        digest.update(b"\0" + file_digest.encode())
    return digest.hexdigest()


async def fingerprint_call(call: CheckedCall) -> str:
    """:func:`fingerprint` of a request read by :mod:`app.calls._inputs` (its files on disk)."""
    body = call.body
    paths = _uploads(body.args, call.args) + _uploads(body.kwargs, call.kwargs)
    digests = await asyncio.to_thread(lambda: [_sha256(path) for path in paths]) if paths else []
    return fingerprint(body, digests)


def _uploads(sent: Any, read: Any) -> list[str]:
    """The files of ``{"file": {"upload": ...}}`` arguments in ``sent`` (the body): the
    same place in ``read`` (the call's arguments) holds the file on disk."""
    if is_file_form(sent):
        path = read.get("path") if isinstance(read, dict) else None
        return [path] if "upload" in sent["file"] and isinstance(path, str) else []
    if isinstance(sent, list) and isinstance(read, list):
        return [p for s, r in zip(sent, read, strict=False) for p in _uploads(s, r)]
    if isinstance(sent, dict) and isinstance(read, dict):
        return [p for k, s in sent.items() if k in read for p in _uploads(s, read[k])]
    return []


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _live(text: str | None) -> dict[str, str] | None:
    """The entry ``text`` holds; None when there is none (absent, or released)."""
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):  # written before fingerprints: the job id alone
        return {"job": text, "fp": "", "state": "accepted"}
    if data.get("state") not in _LIVE or not isinstance(data.get("job"), str):
        return None
    return {"job": data["job"], "fp": str(data.get("fp") or ""), "state": data["state"]}


async def reserve(
    values: SharedValues, caller: str, key: str, job_id: str, fingerprint: str
) -> Held:
    """Hold ``(caller, key)`` for a new job ``job_id`` when the key is free; else the
    entry that holds it. :class:`~app.core._errors.IdempotencyKeyReused` when that entry is
    for another request (another fingerprint)."""
    name = _name(caller, key)
    ours = Held(name, job_id, fingerprint, mine=True, accepted=False)
    text = ours._text("creating")
    stored = await values.update(
        name, lambda held: text if _live(held) is None else None, CREATING_TTL_S
    )
    entry = _live(stored)
    if stored == text or entry is None:  # (None: only a store that lost our write)
        return ours
    if entry["fp"] and entry["fp"] != fingerprint:
        raise IdempotencyKeyReused(
            "this Idempotency-Key was already used with a different request (another body"
            " or other files); send a new key for a new request"
        )
    accepted = entry["state"] == "accepted"
    return Held(name, entry["job"], entry["fp"], mine=False, accepted=accepted)


async def accept(values: SharedValues, held: Held, ttl_s: float) -> bool:
    """The job of ``held`` (this request's reservation) exists: the key names it for
    ``ttl_s``. False when the reservation was no longer this request's (it expired)."""
    creating, accepted = held._text("creating"), held._text("accepted")
    stored = await values.update(
        held.name, lambda current: accepted if current == creating else None, ttl_s
    )
    return stored == accepted


async def release(values: SharedValues, held: Held) -> None:
    """Give the key up: this request's submission was refused, so a retry creates the
    job. Only the request's own reservation, still ``creating``, is released."""
    if not held.mine:
        return
    creating = held._text("creating")
    await values.update(
        held.name, lambda current: _RELEASED if current == creating else None, _RELEASED_TTL_S
    )
