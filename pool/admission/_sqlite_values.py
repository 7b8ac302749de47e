"""Shared values in the SQLite store's file (see :mod:`pool.admission._values`).

One table, keyed ``(ns, key)`` and clustered on it (``WITHOUT ROWID``), so that a scan
of one namespace is a range read of the primary key, and an index on the deadline,
so that purging the expired values reads only them. Admission's transactions never
touch the table; values ride the store's worker thread and group commit like any
other call.

Changes are signalled (:mod:`pool.admission._watch`), but SQLite has no push channel:
one loop per process (:meth:`SQLiteValues._follow`), running while anybody watches,
reads the watched keys every :data:`FOLLOW_S` in one query and wakes the watchers of
those whose value changed; a write of this process wakes its key's watchers at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from ._protocol import StoreUnavailable
from ._values import Update, namespace_of
from ._watch import Changed, Watchers

Transact = Callable[[Callable[[sqlite3.Connection, float], Any]], Awaitable[Any]]
Read = Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]]

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS shared_values (
        ns TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        expires_at REAL NOT NULL,
        PRIMARY KEY (ns, key)) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS shared_values_expiry ON shared_values(expires_at)",
)

_UPSERT = (
    "INSERT INTO shared_values (ns, key, value, expires_at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value,"
    " expires_at = excluded.expires_at"
)
FOLLOW_S = 0.05  # how often the loop reads the watched keys (other processes' writes)
_GET = "SELECT value FROM shared_values WHERE ns = ? AND key = ? AND expires_at > ?"


def _put(conn: sqlite3.Connection, now: float, key: str, value: str, ttl_s: float) -> None:
    conn.execute("DELETE FROM shared_values WHERE expires_at <= ?", (now,))
    conn.execute(_UPSERT, (namespace_of(key), key, value, now + ttl_s))


def _get(conn: sqlite3.Connection, now: float, key: str) -> str | None:
    row = conn.execute(_GET, (namespace_of(key), key, now)).fetchone()
    return None if row is None else str(row[0])


def _get_many(conn: sqlite3.Connection, now: float, keys: list[str]) -> dict[str, str]:
    """The live values of ``keys``: per namespace, reads of the primary key only."""
    by_ns: dict[str, list[str]] = {}
    for key in keys:
        by_ns.setdefault(namespace_of(key), []).append(key)
    found: dict[str, str] = {}
    for ns, names in by_ns.items():
        for i in range(0, len(names), 500):  # below SQLite's bound on parameters
            part = names[i : i + 500]
            rows = conn.execute(
                "SELECT key, value FROM shared_values WHERE ns = ? AND key IN"
                f" ({','.join('?' * len(part))}) AND expires_at > ?",
                (ns, *part, now),
            )
            found.update((str(key), str(value)) for key, value in rows)
    return found


class SQLiteValues:
    """The values of one SQLite store; ``transact``/``read`` run on its worker thread."""

    def __init__(self, transact: Transact, read: Read) -> None:
        self._transact = transact
        self._read = read
        self._watchers = Watchers(self._ready)
        self._follower: asyncio.Task[None] | None = None
        self._stopped = False

    def watch(self, key: str) -> AbstractAsyncContextManager[Changed]:
        return self._watchers.watch(key)

    async def _ready(self) -> None:
        if self._stopped:
            return
        if self._follower is None or self._follower.done():
            self._follower = asyncio.get_running_loop().create_task(
                self._follow(), name="spacepool-values-follow"
            )

    async def _follow(self) -> None:
        """While anybody watches: read the watched keys, wake those that changed (and
        those seen for the first time: a write may have come before the first read)."""
        seen: dict[str, str | None] = {}
        while keys := self._watchers.keys():
            try:
                now = await self._read(lambda conn: _get_many(conn, time.time(), keys))
            except StoreUnavailable:
                now = seen  # the file is away: nothing to tell, try again
            for key in keys:
                if key not in seen or seen[key] != now.get(key):
                    self._watchers.notify(key)
            seen = {key: now.get(key) for key in keys}
            await asyncio.sleep(FOLLOW_S)

    async def aclose(self) -> None:
        """Stop the loop (before the store closes)."""
        self._stopped = True
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower

    async def put(self, key: str, value: str, ttl_s: float) -> None:
        await self._transact(lambda conn, now: _put(conn, now, key, value, ttl_s))
        self._watchers.notify(key)

    async def get(self, key: str) -> str | None:
        found: str | None = await self._read(lambda conn: _get(conn, time.time(), key))
        return found

    async def scan(self, prefix: str) -> dict[str, str]:
        def scan(conn: sqlite3.Connection) -> dict[str, str]:
            rows = conn.execute(
                "SELECT key, value FROM shared_values WHERE ns = ?1"
                " AND substr(key, 1, length(?2)) = ?2 AND expires_at > ?3",
                (namespace_of(prefix), prefix, time.time()),
            )
            return {str(key): str(value) for key, value in rows}

        found: dict[str, str] = await self._read(scan)
        return found

    async def delete(self, key: str) -> None:
        await self._transact(
            lambda conn, _now: conn.execute(
                "DELETE FROM shared_values WHERE ns = ? AND key = ?", (namespace_of(key), key)
            )
        )
        self._watchers.notify(key)

    async def update(self, key: str, update: Update, ttl_s: float) -> str | None:
        def swap(conn: sqlite3.Connection, now: float) -> str | None:
            current = _get(conn, now, key)
            new = update(current)
            if new is None:
                return current
            _put(conn, now, key, new, ttl_s)
            return new

        stored: str | None = await self._transact(swap)  # BEGIN IMMEDIATE: atomic
        self._watchers.notify(key)
        return stored
