"""A Redis that restarts empty mid-run: holders re-register, the cap holds, nobody hangs."""

from __future__ import annotations

import asyncio
import json
import time

from devspaces import SpaceFleet

from ._infra import PrivateRedis
from .conftest import LEASE_TTL_S, Procs, pool_env
from .test_fencing import until

QUEUE_TIMEOUT_S = 15.0
# Requests per process: enough that some are left once traffic is seen running and
# Redis restarted (with 10, a loaded run had served them all before the quarantine ended).
EACH = 16


async def test_redis_restarted_empty_mid_run_keeps_the_cap(
    clean_fleet: SpaceFleet, private_redis: PrivateRedis, procs: Procs
) -> None:
    """3 processes, cap 3, 48 requests; Redis killed and restarted empty while they
    run: the Spaces never see more than 3 calls at once, every request is served or
    fails with a typed error, and every process is done well within its bounds."""
    url = f"{private_redis.url}?prefix=restart:"
    env = pool_env(
        clean_fleet.pool_spaces_env(),
        POOL_GLOBAL_MAX_CONCURRENT="3",
        POOL_MAX_CONNECTIONS="3",
        POOL_QUEUE_TIMEOUT_S=str(QUEUE_TIMEOUT_S),
    )
    workers = [
        procs.spawn(
            "tests.fleet.worker", clean_fleet.pool_spaces_env(), url, str(EACH), f"p{n}", "0.4",
            env=env,
        )
        for n in range(3)
    ]
    busy = lambda: sum(s.stats().in_flight for s in clean_fleet) >= 2  # noqa: E731
    await until(busy, 30, "traffic to run")
    restarted_at = time.time()
    private_redis.kill()
    private_redis.start()  # empty: no limits, no leases, no queue
    began = time.monotonic()
    records: list[dict[str, object]] = []
    for proc in workers:
        out, _ = await asyncio.to_thread(proc.communicate, timeout=QUEUE_TIMEOUT_S + 20)
        assert proc.returncode == 0
        records += json.loads(out.strip().splitlines()[-1])
    took = time.monotonic() - began
    outcomes = sorted(str(r.get("error", "ok")) for r in records)
    starts = [s for sp in clean_fleet for s, _ in sp.intervals()]
    # Calls admitted just before the kill may begin at the Space a moment after it.
    after = [s for s in starts if s > restarted_at + 1.0]
    print(f"outcomes {dict((o, outcomes.count(o)) for o in set(outcomes))}; "
          f"peak {clean_fleet.concurrent_peak()}; {len(after)} calls began after the "
          f"restart; done {took:.1f} s after it")  # fmt: skip
    assert len(records) == 3 * EACH
    assert all(r.get("ok") is True or r.get("error") in {"busy", "lease_lost"} for r in records)
    assert clean_fleet.concurrent_peak() <= 3
    assert after, "nothing was served after the restart"
    assert min(after) - restarted_at >= LEASE_TTL_S * 0.9, "granted during the quarantine"
    assert max(starts) > restarted_at + LEASE_TTL_S
