"""Managed Redis: a Redis Cluster, TLS; the layout's version and an evicting Redis
refused at start (issue 39, items 3 and 7). The Sentinel failover under load, measured
at the Spaces, is tests/chaos/test_sentinel_failover.py.

Each test starts its own redis-server processes on free loopback ports
(:mod:`tests.admission._managed_redis`), removed at the end whatever happens.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pool import BusyError
from pool._settings import PoolSettings
from pool.admission import Coordinator, Lease, StoreRefused, open_coordinator
from pool.admission._redis_conn import cluster_prefix, parse_target
from pool.admission._store_layout import REDIS_LAYOUT, SQLITE_LAYOUT
from tests.admission._managed_redis import (
    Servers,
    make_tls,
    require_redis_server,
    slot_owner,
    start_cluster,
)
from tests.admission.conftest import REDIS_URL

TTL_S = 3.0
# The safety poll is put out of reach: a grant another process makes arrives by pub/sub.
NO_POLL = "poll_ms=60000"


@pytest.fixture
def servers() -> Iterator[Servers]:
    """redis-server processes of this test, killed (and their directory removed) after it."""
    require_redis_server()
    with Servers() as group:
        yield group


async def _handoff(first: Coordinator, second: Coordinator) -> float:
    """``first`` holds the one slot, ``second`` waits; the release reaches ``second``
    (by the store's push: no poll): seconds from the release to its grant."""
    await first.set_limits({"space:a": 1})
    lease = await _first_lease(first)
    waiting = asyncio.create_task(second.acquire(["space:a"], timeout=10))
    await asyncio.sleep(0.3)  # queued behind the holder (nothing to order: a wait for state)
    assert not waiting.done()
    released = time.monotonic()
    await first.release(lease)
    other = await waiting
    took = time.monotonic() - released
    await second.release(other)
    return took


async def _first_lease(coord: Coordinator) -> Lease:
    """A server younger than one TTL admits nothing (the quarantine); with the poll out
    of reach, each new try runs the pass that ends it."""
    deadline = time.monotonic() + 3 * TTL_S
    while True:
        try:
            return await coord.acquire(["space:a"], timeout=0.25)
        except BusyError:
            assert time.monotonic() < deadline, "still nothing admitted"


async def _closing(*coordinators: Coordinator) -> None:
    for coordinator in coordinators:
        await coordinator.aclose()


async def test_cluster_admits_through_any_node_and_pushes_grants(servers: Servers) -> None:
    """On a 3-master cluster, named by a node that does not own the store's slot, two
    processes hand a slot over by pub/sub, values are watched, many calls go at once,
    flushed scripts are loaded again; a plain redis:// URL to a node works too."""
    ports = start_cluster(servers)
    owner = slot_owner(ports, "{spacepool:}meta")
    elsewhere = next(p for p in ports if p != owner)
    url = f"redis+cluster://127.0.0.1:{elsewhere}/?{NO_POLL}&timeout_ms=5000"
    a = open_coordinator(url, lease_ttl_s=TTL_S)
    b = open_coordinator(url, lease_ttl_s=TTL_S)
    try:
        took = await _handoff(a, b)
        assert took < 2.0, f"the grant took {took:.2f} s: not pushed"
        async with b.values.watch("job:x") as changed:
            while await changed.wait(0.2):  # a first wake-up may be spurious
                pass
            await a.values.put("job:x", "v", ttl_s=30)
            assert await changed.wait(5.0)
        assert await b.values.get("job:x") == "v"
        # 40 at once: more than one script run, so a pipeline through the cluster client;
        # then the scripts flushed on the slot's master: loaded again, and on we go.
        await a.set_limits({"space:many": 40})
        leases = await asyncio.gather(*(a.acquire(["space:many"], timeout=5) for _ in range(40)))
        await asyncio.gather(*(a.release(lease) for lease in leases))
        with redis.Redis(port=owner) as r:
            r.script_flush()
        await a.release(await a.acquire(["space:many"], timeout=5))
        with redis.Redis(port=owner, decode_responses=True) as r:  # every key in one slot
            keys = r.keys("{spacepool:}*")
            assert "{spacepool:}meta" in keys and "{spacepool:}values:job:" in keys
            assert r.get("{spacepool:}layout") == str(REDIS_LAYOUT)
        for port in ports:
            if port != owner:
                with redis.Redis(port=port) as r:
                    assert r.dbsize() == 0
    finally:
        await _closing(a, b)
    # A plain URL naming a node that does not own the slot: the cluster is detected at
    # the first call, and the cluster client and the tagged prefix are used.
    plain = f"redis://127.0.0.1:{elsewhere}/0?{NO_POLL}&timeout_ms=5000"
    a, b = (open_coordinator(plain, lease_ttl_s=TTL_S) for _ in range(2))
    try:
        assert await _handoff(a, b) < 2.0
        assert a.prefix == "{spacepool:}"  # type: ignore[attr-defined]
    finally:
        await _closing(a, b)
    # One master that may evict keys: refused (every master is read).
    with redis.Redis(port=ports[-1]) as r:
        r.config_set("maxmemory", "100mb")
        r.config_set("maxmemory-policy", "volatile-lru")
    evicting = open_coordinator(url, lease_ttl_s=TTL_S)
    try:
        with pytest.raises(StoreRefused, match="volatile-lru"):
            await evicting.set_limits({"space:a": 1})
    finally:
        await evicting.aclose()


async def test_tls_with_a_certificate_authority(servers: Servers) -> None:
    """``rediss://`` with the CA of POOL_COORDINATOR_CA_FILE admits and pushes; without
    that CA the server's certificate is not trusted: a typed 503, never a grant."""
    tls = make_tls(servers.dir)
    port = servers.start("--port", "0", "--tls-port", str(free := _free()),
                         "--tls-cert-file", tls["cert"], "--tls-key-file", tls["key"],
                         "--tls-ca-cert-file", tls["ca"], "--tls-auth-clients", "no",
                         port=free)  # fmt: skip
    servers.wait_ping(port, ca=tls["ca"])
    url = f"rediss://127.0.0.1:{port}/0?{NO_POLL}&timeout_ms=5000"
    a = open_coordinator(url, lease_ttl_s=TTL_S, ca_file=tls["ca"])
    b = open_coordinator(url, lease_ttl_s=TTL_S, ca_file=tls["ca"])
    untrusted = open_coordinator(url, lease_ttl_s=TTL_S)
    try:
        assert await _handoff(a, b) < 2.0
        with pytest.raises(BusyError) as busy:
            await untrusted.set_limits({"space:a": 1})
        assert busy.value.reason == "coordinator_unavailable"
    finally:
        await _closing(a, b, untrusted)


def test_url_forms() -> None:
    """The URL forms of docs/leases.md (Stores) are read as documented; a malformed
    one is refused at construction with the form to write."""
    cluster = parse_target("rediss+cluster://u:p%40w@a:7000,b:7001/")
    assert (cluster.kind, cluster.tls, cluster.nodes) == (
        "cluster",
        True,
        (("a", 7000), ("b", 7001)),
    )
    assert (cluster.username, cluster.password, cluster.where) == ("u", "p@w", "a:7000,b:7001")
    sentinel = parse_target("redis+sentinel://s1:26379,s2:26380/mymaster/2")
    assert (sentinel.kind, sentinel.service, sentinel.db, sentinel.tls) == (
        "sentinel",
        "mymaster",
        2,
        False,
    )
    assert parse_target("rediss://:pw@h:6380/0").kind == "single"
    for bad in ("redis+sentinel://s1:26379/", "redis+cluster://a:1/3", "redis+other://a:1/"):
        with pytest.raises(ValueError):
            parse_target(bad)
    assert cluster_prefix("spacepool:") == "{spacepool:}"
    assert cluster_prefix("{team-a}:") == "{team-a}:"
    assert cluster_prefix("x{}y}:") == "{x{}y}:}"  # an empty tag hashes the whole key


def test_ca_file_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """POOL_COORDINATOR_CA_FILE and POOL_ALLOW_EVICTING_STORE are settings."""
    monkeypatch.setenv("POOL_COORDINATOR_CA_FILE", "/etc/ssl/our-ca.pem")
    monkeypatch.setenv("POOL_ALLOW_EVICTING_STORE", "true")
    settings = PoolSettings()
    assert settings.coordinator_ca_file == "/etc/ssl/our-ca.pem"
    assert settings.allow_evicting_store is True


def _free() -> int:
    from devspaces import free_port

    return free_port()


# -- item 7: the layout's version, eviction ------------------------------------------------

async def test_redis_of_another_layout_is_refused(redis_prefix: str) -> None:
    """A store recorded by another release is refused in one line naming both
    versions; so is an unversioned store with state (layout 1, before issue 39's index);
    an empty one is recorded as ours."""
    url = f"{REDIS_URL}?prefix={redis_prefix}&timeout_ms=10000"
    with redis.Redis.from_url(REDIS_URL) as r:
        r.set(redis_prefix + "layout", str(REDIS_LAYOUT + 1))
    coord = open_coordinator(url, lease_ttl_s=TTL_S)
    try:
        with pytest.raises(StoreRefused) as refused:
            await coord.set_limits({"space:a": 1})
        line = str(refused.value)
        assert "\n" not in line
        assert f"layout {REDIS_LAYOUT + 1}" in line and f"layout {REDIS_LAYOUT}" in line
        with pytest.raises(StoreRefused):  # values too: nothing is read or written
            await coord.values.put("job:a", "v", ttl_s=5)
    finally:
        await coord.aclose()
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        r.delete(redis_prefix + "layout")
        r.hset(redis_prefix + "meta", "epoch", "older")  # made before versions
    coord = open_coordinator(url, lease_ttl_s=TTL_S)
    try:
        older = f"layout 1, this process uses layout {REDIS_LAYOUT}"
        with pytest.raises(StoreRefused, match=older):
            await coord.set_limits({"space:a": 1})
    finally:
        await coord.aclose()
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        r.delete(redis_prefix + "meta")  # an empty store: recorded as ours
    coord = open_coordinator(url, lease_ttl_s=TTL_S)
    try:
        await coord.set_limits({"space:a": 1})
        await coord.release(await coord.acquire(["space:a"], timeout=5))
    finally:
        await coord.aclose()
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        assert r.get(redis_prefix + "layout") == str(REDIS_LAYOUT)


async def test_evicting_redis_refused_or_warned(
    servers: Servers, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis that may evict keys is refused at start; with POOL_ALLOW_EVICTING_STORE
    the process starts and says why in one warning."""
    port = servers.start("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru")
    servers.wait_ping(port)
    url = f"redis://127.0.0.1:{port}/0?timeout_ms=5000"
    coord = open_coordinator(url, lease_ttl_s=TTL_S)
    try:
        with pytest.raises(StoreRefused, match="allkeys-lru") as refused:
            await coord.set_limits({"space:a": 1})
        assert "\n" not in str(refused.value)
    finally:
        await coord.aclose()
    coord = open_coordinator(url, lease_ttl_s=TTL_S, allow_evicting_store=True)
    try:
        with caplog.at_level(logging.WARNING, logger="spacepool.admission"):
            await coord.set_limits({"space:a": 1})
        assert [r for r in caplog.records if "allkeys-lru" in r.getMessage()]
        await coord.values.put("job:a", "v", ttl_s=5)  # it runs
    finally:
        await coord.aclose()


async def test_sqlite_of_another_layout_is_refused(tmp_path: Path) -> None:
    """An SQLite file of another layout is refused in one line; an unversioned file
    with tables (today's layout) is adopted."""
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE limits (resource TEXT PRIMARY KEY, lim INTEGER NOT NULL)")
        conn.execute(f"PRAGMA user_version = {SQLITE_LAYOUT + 1}")
    coord = open_coordinator(f"sqlite:///{path}", lease_ttl_s=TTL_S)
    try:
        with pytest.raises(StoreRefused, match=f"layout {SQLITE_LAYOUT + 1}") as refused:
            await coord.set_limits({"space:a": 1})
        assert "\n" not in str(refused.value)
    finally:
        await coord.aclose()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 0")  # made before versions
    coord = open_coordinator(f"sqlite:///{path}", lease_ttl_s=TTL_S)
    try:
        await coord.set_limits({"space:a": 1})
    finally:
        await coord.aclose()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SQLITE_LAYOUT


async def test_drained_sqlite_file_of_layout_3_is_upgraded_in_place(tmp_path: Path) -> None:
    """A drained SQLite file of layout 3 is upgraded in place: the indexes nobody reads
    are dropped, the limits kept, and admission runs on it."""
    path = tmp_path / "layout3.db"
    coord = open_coordinator(f"sqlite:///{path}", lease_ttl_s=TTL_S)
    try:
        await coord.set_limits({"space:a": 1})
    finally:
        await coord.aclose()
    unread = ("waiters_expiry", "leases_expiry", "waiters_lane")
    with sqlite3.connect(path) as conn:  # as layout 3 left it
        conn.execute("CREATE INDEX waiters_expiry ON waiters(expires_at)")
        conn.execute("CREATE INDEX leases_expiry ON leases(expires_at)")
        conn.execute("CREATE INDEX waiters_lane ON waiters(lane, rank, seq)")
        conn.execute("PRAGMA user_version = 3")
    coord = open_coordinator(f"sqlite:///{path}", lease_ttl_s=TTL_S)
    try:
        lease = await coord.acquire(["space:a"], timeout=1)
        with pytest.raises(BusyError):
            await coord.acquire(["space:a"], timeout=0.1)  # the kept limit holds
        await coord.release(lease)
    finally:
        await coord.aclose()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SQLITE_LAYOUT == 4
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert not names & set(unread)
