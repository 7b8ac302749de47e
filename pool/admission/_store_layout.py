"""What a store must be before a process uses it: its layout's version, no eviction.

The SQLite file and the Redis keys outlive a process, so processes of two releases can
meet in one store. Each store records the version of its layout (the tables, keys and
what they hold): SQLite in ``PRAGMA user_version``, Redis in ``<prefix>layout``. A
process that finds another version refuses to start with :class:`StoreRefused` (one
line naming both), instead of mixing its reads and writes with the other's. A store
made before versions existed (tables or ``<prefix>meta`` present, no version) has
layout 1, today's. Bump a constant below whenever a change makes the old and the new
code unable to share a store, and with it give the step that migrates a drained store
of the previous version (where the check below meets it); docs/leases.md ("Upgrades")
says how an operator moves a live fleet across it.

A Redis that evicts keys under memory pressure (``maxmemory-policy`` other than
``noeviction``, with a ``maxmemory``) can drop a lease or a waiter: the cap no longer
holds. The process refuses to start, or, with ``POOL_ALLOW_EVICTING_STORE=true``, says
so once in a warning and goes on.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

_log = logging.getLogger("spacepool.admission")

REDIS_LAYOUT = 2  # 2: lanes parked under a full resource, owners' liveness (issue 39)
# SQLite, issue 39 — 2: the grant index's tables and triggers; 3: owners' liveness; 4: the
# indexes no statement reads dropped (the rows' own deadlines, the lanes without held_back)
SQLITE_LAYOUT = 4
_SQLITE_MIGRATES = {1, 2, 3}  # drained files of these layouts are upgraded in place at open
_UNVERSIONED = 1  # a store made before the layout was recorded

# KEYS: layout, meta; ARGV: our version, "claim" ("1": write ours even over an
# unversioned store that has state; a running process that passed the check does so
# after the store was reset under it). Answers the store's version, set if absent.
LAYOUT_SCRIPT = """
local v = redis.call('GET', KEYS[1])
if v then return v end
if ARGV[2] ~= '1' and redis.call('EXISTS', KEYS[2]) == 1 then return 'unversioned' end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"""


class StoreRefused(Exception):
    """This process must not use the store (another layout version, or eviction)."""


def layout_problem(found: str, ours: int, where: str) -> str | None:
    """Why a store whose recorded layout is ``found`` cannot be used (None if it can)."""
    version = _UNVERSIONED if found == "unversioned" else found
    if str(version) == str(ours):
        return None
    return (
        f"the admission store {where} has layout {version}, this process uses layout {ours}:"
        " processes of two releases must not share it (stop the others first, or give"
        " this release its own store; docs/leases.md, Upgrades)"
    )


def eviction_problem(infos: list[dict[str, Any]], where: str) -> str | None:
    """A line saying the store may evict keys (``INFO memory`` of each node), or None."""
    for info in infos:
        policy = str(info.get("maxmemory_policy", "noeviction"))
        maxmemory = int(info.get("maxmemory", 0) or 0)
        if policy != "noeviction" and maxmemory > 0:
            return (
                f"the admission store {where} may evict keys (maxmemory-policy {policy},"
                f" maxmemory {maxmemory}): an evicted lease or waiter breaks the cap; set"
                " maxmemory-policy noeviction (or POOL_ALLOW_EVICTING_STORE=true to run anyway)"
            )
    return None


def report_eviction(problem: str | None, *, allow: bool) -> None:
    """Refuse (raise) or, when allowed, warn once."""
    if problem is None:
        return
    if not allow:
        raise StoreRefused(problem)
    _log.warning("%s", problem)


def check_sqlite_layout(conn: sqlite3.Connection, where: str) -> None:
    """Inside the schema's write transaction, before any table is created: refuse a
    file of another layout; record ours in a new (or unversioned) file."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version == 0:
        tables = conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'")
        version = _UNVERSIONED if int(tables.fetchone()[0]) else SQLITE_LAYOUT
    if version in _SQLITE_MIGRATES:  # the schema's creation adds what the layout needs
        _log.warning("sqlite %s: upgrading the store from layout %d to %d (every process"
                     " of the earlier release must be stopped)", where, version, SQLITE_LAYOUT)
        version = SQLITE_LAYOUT
    problem = layout_problem(str(version), SQLITE_LAYOUT, f"sqlite {where}")
    if problem is not None:
        raise StoreRefused(problem)
    conn.execute(f"PRAGMA user_version = {SQLITE_LAYOUT}")
