"""Shared values in the SQLite store's file (see :mod:`pool.admission._values`).

One table, keyed ``(ns, key)`` and clustered on it (``WITHOUT ROWID``), so that a scan
of one namespace is a range read of the primary key, and an index on the deadline,
so that purging the expired values reads only them. Admission's transactions never
touch the table; values ride the store's worker thread and group commit like any
other call.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ._values import Update, namespace_of

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
_GET = "SELECT value FROM shared_values WHERE ns = ? AND key = ? AND expires_at > ?"


def _put(conn: sqlite3.Connection, now: float, key: str, value: str, ttl_s: float) -> None:
    conn.execute("DELETE FROM shared_values WHERE expires_at <= ?", (now,))
    conn.execute(_UPSERT, (namespace_of(key), key, value, now + ttl_s))


def _get(conn: sqlite3.Connection, now: float, key: str) -> str | None:
    row = conn.execute(_GET, (namespace_of(key), key, now)).fetchone()
    return None if row is None else str(row[0])


class SQLiteValues:
    """The values of one SQLite store; ``transact``/``read`` run on its worker thread."""

    def __init__(self, transact: Transact, read: Read) -> None:
        self._transact = transact
        self._read = read

    async def put(self, key: str, value: str, ttl_s: float) -> None:
        await self._transact(lambda conn, now: _put(conn, now, key, value, ttl_s))

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

    async def update(self, key: str, update: Update, ttl_s: float) -> str | None:
        def swap(conn: sqlite3.Connection, now: float) -> str | None:
            current = _get(conn, now, key)
            new = update(current)
            if new is None:
                return current
            _put(conn, now, key, new, ttl_s)
            return new

        stored: str | None = await self._transact(swap)  # BEGIN IMMEDIATE: atomic
        return stored
