"""API keys: each team's own key, a consumer of the pool with its own limits (issue 32).

A key has a name, a concurrency limit (admitted all-or-nothing with the Space and
global slots: the coordinator's ``consumer:key:<id>`` resource, pool/_consumer.py), an
optional default priority class and optional daily quotas (app/teams/_usage.py). The admin
manages keys over ``/api/admin/keys``; the secret is shown once, at creation.

**Stored hashed, in the coordinator.** Each key is one shared value
``apikey:<id>`` (its SHA-256, never the secret; a key is 32 random bytes, so a plain
hash cannot be reversed by guessing) that lives until it is deleted. A revoked key's
``apikey:<id>`` is deleted (every reader refuses it) and its record, marked
``revoked_at``, kept as ``revokedkey:<id>``: listed as revoked, found by no lookup.

**Names are unique among live keys, across admins and workers**: a key claims its
name with an atomic update of ``apikeyname:<name>`` before its record is written (two
admins creating one name at once: one gets 409), gives it up when revoked or renamed,
and a claim whose key never came to exist is taken over after ``_CLAIM_STALE_S``.

**Every worker, within a second.** Each process keeps every key in memory (a lookup
costs no store round trip) and reloads them all when ``apikeys:rev`` is written: the
admin's worker writes it after each change, and the coordinator's change signal
(:meth:`SharedValues.watch`: Redis pub/sub, SQLite's 50 ms follower) wakes every
other worker's reload. A reload also runs every ``_RELOAD_S`` in case a signal was
lost, and on a miss (a key created a moment ago elsewhere) when ``apikeys:rev`` moved
since the last reload (one small read), or ``_MISS_RELOAD_S`` passed. A store that does
not answer leaves the last keys in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from pool import BusyError, PoolError, cancel_and_wait, cancelling, get_pool
from pool.admission import CONSUMER_PREFIX, Consumer, SharedValues, anonymous_of

from ..core import KeyNameTaken, KeyNotFound

_log = logging.getLogger("spacepool.app")

KEY_PREFIX = "sp_"
"""Every key starts with it (a presented bearer token that does is never the API token)."""
NAME_PATTERN = r"^[A-Za-z0-9][\w.@-]{0,63}$"  # no CSV formula, no markup
_NS = "apikey:"
_REVOKED = "revokedkey:"  # a revoked key's record, kept apart: readers of apikey: never see it
_REV = "apikeys:rev"
_NAME = "apikeyname:"  # a live key's claim on its name: "<key id> <claimed at>", "" once given up
_CLAIM_STALE_S = 60.0  # a claim whose key never came to exist (its admin's worker died)
_FOREVER_S = 100 * 365 * 86400.0  # shared values expire; a key lives until deleted
_RELOAD_S = 10.0
_MISS_RELOAD_S = 0.25

Priority = Literal["interactive", "batch"]


class KeyChange(BaseModel):
    """``PATCH /api/admin/keys/{id}``: what to change (omitted fields stay)."""

    model_config = {"extra": "forbid"}

    name: str | None = Field(default=None, min_length=1, max_length=64, pattern=NAME_PATTERN)
    max_concurrent: int | None = Field(default=None, ge=1, le=10_000)
    priority: Priority | None = None
    daily_calls: int | None = Field(default=None, ge=1, le=10**12)
    daily_space_seconds: float | None = Field(default=None, gt=0, le=1e12, allow_inf_nan=False)


class KeyCreate(KeyChange):
    """``POST /api/admin/keys``."""

    name: str = Field(min_length=1, max_length=64, pattern=NAME_PATTERN)
    max_concurrent: int = Field(ge=1, le=10_000)


class KeyRecord(BaseModel):
    """A key as the coordinator keeps it (``hash``: its SHA-256, hex)."""

    id: str
    name: str
    hash: str
    max_concurrent: int
    priority: Priority | None = None
    daily_calls: int | None = None
    daily_space_seconds: float | None = None
    created_at: float  # Unix seconds (kept as it was; "created" is its ISO 8601 form)
    revoked_at: str | None = None  # ISO 8601 (UTC) once revoked: kept, marked, refused

    def view(self) -> dict[str, Any]:
        """What the admin API shows (no hash): ``created`` (ISO 8601) beside the Unix
        ``created_at``; ``revoked`` and ``revoked_at`` (ISO 8601, or null)."""
        shown = self.model_dump(exclude={"hash"})
        shown["created"] = iso_utc(self.created_at)
        shown["revoked"] = self.revoked_at is not None
        return shown

    def consumer(self) -> Consumer:
        """The key as the pool's consumer (pool/_consumer.py)."""
        return Consumer(self.name, self.id, self.priority)


def iso_utc(epoch: float) -> str:
    """``2026-01-02T03:04:05Z``: the form of every time the service shows."""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def limit_of(record: KeyRecord) -> dict[str, int]:
    """The key's admission limits, as the coordinator's resources: the key's, and its
    anonymous callers' (``POOL_ANONYMOUS_MAX_CONCURRENT`` per key, issue 38)."""
    anonymous = CONSUMER_PREFIX + anonymous_of(record.id)
    return {record.consumer().resource: record.max_concurrent,
            anonymous: get_pool().settings.anonymous_limit}  # fmt: skip


class Keys:
    """This process's copy of every key (module docstring), and the admin's changes."""

    def __init__(self, values: Callable[[], SharedValues]) -> None:
        self._values = values
        self._by_hash: dict[str, KeyRecord] = {}
        self._by_id: dict[str, KeyRecord] = {}
        self._loaded_at = 0.0
        self._rev: str | None = None  # apikeys:rev as of the last reload
        self._reloading: asyncio.Lock | None = None
        self._follower: asyncio.Task[None] | None = None

    # -- reading ---------------------------------------------------------------------
    async def start(self) -> None:
        with contextlib.suppress(PoolError):
            await self.reload()
            limits: dict[str, int] = {}
            for record in self._by_id.values():  # keys made before a setting changed
                limits.update(limit_of(record))
            if limits:
                await get_pool().coordinator.set_limits(limits)
        self._follower = asyncio.get_running_loop().create_task(self._follow())

    async def aclose(self) -> None:
        if self._follower is not None:
            await cancel_and_wait(self._follower)

    async def reload(self) -> None:
        """Read every key from the coordinator (BusyError when it does not answer)."""
        if self._reloading is None:
            self._reloading = asyncio.Lock()
        async with self._reloading:
            rev = await self._values().get(_REV)  # before the scan: a later write reloads
            found = await self._values().scan(_NS)
            records = [KeyRecord.model_validate_json(v) for v in found.values()]
            revoked = await self._values().scan(_REVOKED)
            records += [KeyRecord.model_validate_json(v) for v in revoked.values()]
            records = [r for r in records if r.revoked_at is not None or _REVOKED + r.id
                       not in revoked]  # fmt: skip
            self._by_id = {r.id: r for r in records}
            self._by_hash = {r.hash: r for r in records if r.revoked_at is None}
            self._loaded_at = time.monotonic()
            self._rev = rev

    async def _follow(self) -> None:
        """Reload at each write of ``apikeys:rev`` anywhere in the fleet."""
        while True:
            try:
                async with self._values().watch(_REV) as changed:
                    while not cancelling():  # a store error may be how a cancel came
                        await changed.wait(_RELOAD_S)
                        with contextlib.suppress(BusyError):
                            await self.reload()
                raise asyncio.CancelledError
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a store hiccup: keep the last keys, try again
                if cancelling():
                    raise asyncio.CancelledError from exc
                _log.warning("API keys: following changes failed (%s)", type(exc).__name__)
                await asyncio.sleep(1.0)

    async def find(self, secret: str) -> KeyRecord | None:
        """The live key whose secret is ``secret``, or None."""
        digest = key_hash(secret)
        found = self._by_hash.get(digest)
        if found is None:
            # A key made a moment ago on another worker may not have reached this copy
            # yet (its change signal is in flight): one read of apikeys:rev tells, so a
            # new key works everywhere at once. A full reload at most every
            # _MISS_RELOAD_S otherwise (a stream of unknown keys costs one small read).
            with contextlib.suppress(BusyError):
                stale = time.monotonic() - self._loaded_at >= _MISS_RELOAD_S
                if stale or await self._values().get(_REV) != self._rev:
                    await self.reload()
            found = self._by_hash.get(digest)
        return found

    def revoked(self, secret: str) -> KeyRecord | None:
        """The revoked key whose secret is ``secret``, if this copy knows one: for a
        refusal that says "revoked" rather than "wrong token" (no reload on a miss)."""
        digest = key_hash(secret)
        return next((r for r in self._by_id.values()
                     if r.revoked_at is not None and r.hash == digest), None)  # fmt: skip

    def all(self) -> list[KeyRecord]:
        """Every key, the revoked ones included (marked), oldest first."""
        return sorted(self._by_id.values(), key=lambda r: r.created_at)

    def get(self, key_id: str) -> KeyRecord | None:
        """The live key of that id (a revoked one is None)."""
        found = self._by_id.get(key_id)
        return found if found is not None and found.revoked_at is None else None

    # -- the admin's changes ---------------------------------------------------------
    def _name_free(self, name: str, key_id: str | None = None) -> None:
        """KeyNameTaken (409) when another live key is called ``name``: a key's name is
        what its usage and metrics show, so one team cannot pose as another there."""
        if any(r.name == name and r.id != key_id and r.revoked_at is None
               for r in self._by_id.values()):  # fmt: skip
            raise KeyNameTaken(f"another API key is called {name[:64]!r}")

    async def _claim(self, name: str, key_id: str) -> None:
        """Claim ``name`` for ``key_id`` in the shared store, atomically (the check above
        reads this worker's copy, which another admin's create may not have reached)."""
        self._name_free(name, key_id)
        live = {r.id for r in self._by_id.values() if r.revoked_at is None}
        now = time.time()

        def claim(current: str | None) -> str | None:
            holder, _, at = (current or "").partition(" ")
            if holder and holder != key_id and (
                holder in live or now - float(at or 0) < _CLAIM_STALE_S
            ):
                return None  # held: left as it is
            return f"{key_id} {now}"

        stored = await self._values().update(_NAME + name, claim, _FOREVER_S)
        if (stored or "").partition(" ")[0] != key_id:
            raise KeyNameTaken(f"another API key is called {name[:64]!r}")

    async def _give_up(self, name: str, key_id: str) -> None:
        """Free ``name`` if ``key_id`` holds it (an update, so another key's claim stays)."""
        await self._values().update(
            _NAME + name, lambda cur: "" if (cur or "").partition(" ")[0] == key_id else None,
            _FOREVER_S,
        )  # fmt: skip

    async def create(self, body: KeyCreate) -> tuple[KeyRecord, str]:
        await self.reload()
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        record = KeyRecord(
            id=secrets.token_hex(8), hash=key_hash(secret), created_at=time.time(),
            **body.model_dump(),
        )  # fmt: skip
        await self._claim(record.name, record.id)
        await self._write(record)
        return record, secret

    async def change(self, key_id: str, body: KeyChange) -> KeyRecord:
        await self.reload()
        record = self.get(key_id)
        if record is None:
            raise KeyNotFound(f"no live key {key_id[:32]!r}")
        update = body.model_dump(exclude_unset=True)
        for required in ("name", "max_concurrent"):  # null: left as it is
            if update.get(required, 0) is None:
                del update[required]
        changed = record.model_copy(update=update)
        await self._claim(changed.name, key_id)
        await self._write(KeyRecord.model_validate(changed.model_dump()))
        if changed.name != record.name:
            await self._give_up(record.name, key_id)
        return changed

    async def revoke(self, key_id: str) -> None:
        """Mark the key revoked (kept, so that lists and usage show it as such): no
        lookup finds it from the next reload on, on every worker."""
        await self.reload()
        record = self.get(key_id)
        if record is None:
            raise KeyNotFound(f"no live key {key_id[:32]!r}")
        revoked = record.model_copy(update={"revoked_at": iso_utc(time.time())})
        await self._values().put(_REVOKED + key_id, revoked.model_dump_json(), _FOREVER_S)
        await self._values().delete(_NS + key_id)  # refused by every reader, old ones too
        await self._give_up(record.name, key_id)
        await self._signal()

    async def _write(self, record: KeyRecord) -> None:
        await get_pool().coordinator.set_limits(limit_of(record))  # before it can be used
        await self._values().put(_NS + record.id, record.model_dump_json(), _FOREVER_S)
        await self._signal()

    async def _signal(self) -> None:
        await self._values().put(_REV, secrets.token_hex(8), _FOREVER_S)
        await self.reload()
