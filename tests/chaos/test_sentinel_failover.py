"""A Sentinel failover under load: the master SIGKILLed, a replica promoted; measured
at the Spaces (docs/leases.md, Stores)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator

import pytest
import redis.asyncio

from devspaces import SpaceFleet, free_port
from tests.admission._managed_redis import (
    Servers,
    require_redis_server,
    sentinel_logs,
    start_sentinels,
)

from .conftest import LEASE_TTL_S, Procs, pool_env
from .test_fencing import until

CAP = 3
LOOPS = 4  # callers per process, each one request after another
QUEUE_TIMEOUT_S = 5.0


@pytest.fixture
def servers() -> Iterator[Servers]:
    """redis-server processes of this test, killed (and their directory removed) after it."""
    require_redis_server()
    with Servers() as group:
        yield group


def _over_cap_s(fleet: SpaceFleet, cap: int) -> tuple[int, float]:
    """The Spaces' peak of calls at once, and how long more than ``cap`` ran."""
    events = sorted(
        [(t, d) for sp in fleet for s, e in sp.intervals() for t, d in ((s, 1), (e, -1))],
        key=lambda e: (e[0], e[1]),
    )
    peak = running = 0
    over, since = 0.0, 0.0
    for t, delta in events:
        before = running
        running += delta
        peak = max(peak, running)
        if before <= cap < running:
            since = t
        elif running <= cap < before:
            over += t - since
    return peak, over


async def _promoted(servers: Servers, sentinel: int, replica: int, within_s: float) -> float:
    """The wall-clock time at which the sentinel names the replica as the master."""
    deadline = time.monotonic() + within_s
    async with redis.asyncio.Redis(port=sentinel, decode_responses=True) as r:
        while True:
            addr = await r.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "svc")
            if addr and int(addr[1]) == replica:
                return time.time()
            assert time.monotonic() < deadline, "no promotion:\n" + sentinel_logs(servers)
            await asyncio.sleep(0.05)


async def test_master_killed_under_load(
    clean_fleet: SpaceFleet, servers: Servers, procs: Procs
) -> None:
    """2 processes under steady load, cap 3, a redis+sentinel:// URL; the master
    SIGKILLed while they run: calls start again at the Spaces within 10 s of the
    promotion, every request is served or fails typed (busy, lease_lost) within its
    bounds, and any time over the cap is at most TTL/3 (a lagging replica,
    docs/leases.md)."""
    master, replica, sentinels = start_sentinels(servers, "svc")
    stop = servers.dir / "stop"
    hosts = ",".join(f"127.0.0.1:{p}" for p in [free_port(), *sentinels])  # one is down
    url = f"redis+sentinel://{hosts}/svc/0?prefix=failover:"
    env = pool_env(
        clean_fleet.pool_spaces_env(),
        POOL_GLOBAL_MAX_CONCURRENT=str(CAP),
        POOL_MAX_CONNECTIONS=str(CAP),
        POOL_QUEUE_TIMEOUT_S=str(QUEUE_TIMEOUT_S),
    )
    args = (clean_fleet.pool_spaces_env(), url, str(LOOPS), str(stop))
    workers = [procs.spawn("tests.chaos._steady", *args, f"p{n}", "0.2", env=env) for n in (1, 2)]
    busy = lambda: sum(s.stats().in_flight for s in clean_fleet) >= 2  # noqa: E731
    await until(busy, 45, "traffic to run")
    killed = time.time()
    servers.kill(master)
    promoted = await _promoted(servers, sentinels[0], replica, within_s=25)
    # The load goes on until a call has run at a Space after the promotion (10 s at most).
    resumed = lambda: any(s > promoted for sp in clean_fleet for s, _ in sp.intervals())  # noqa: E731
    with contextlib.suppress(AssertionError):
        await until(resumed, 10, "a call after the promotion")
    await asyncio.sleep(1.0)  # and a little more, on the new master
    stop.touch()
    records: list[dict[str, object]] = []
    for proc in workers:
        out, _ = await asyncio.to_thread(proc.communicate, timeout=QUEUE_TIMEOUT_S + 20)
        assert proc.returncode == 0
        records += json.loads(out.strip().splitlines()[-1])
    outcomes = sorted(str(r["outcome"]) for r in records)
    starts = sorted(s for sp in clean_fleet for s, _ in sp.intervals())
    after = [s for s in starts if s > promoted]
    peak, over_s = _over_cap_s(clean_fleet, CAP)
    print(f"promotion {promoted - killed:.2f} s after the kill; first call at a Space"
          f" {after[0] - promoted if after else float('nan'):.2f} s after it; outcomes"
          f" {dict((o, outcomes.count(o)) for o in set(outcomes))}; Space peak {peak}"
          f" (cap {CAP}), over the cap {over_s:.3f} s")  # fmt: skip
    assert set(outcomes) <= {"ok", "busy", "lease_lost"}, outcomes
    stopped = stop.stat().st_mtime
    assert max(float(str(r["end"])) for r in records) < stopped + QUEUE_TIMEOUT_S + 5
    assert after and after[0] - promoted <= 10.0, "no call within 10 s of the promotion"
    assert over_s <= LEASE_TTL_S / 3
