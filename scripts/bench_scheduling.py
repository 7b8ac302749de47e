"""Scheduling (issue 18): an idle Space behind a busy Space's backlog, per rule and store.

    .venv/bin/python scripts/bench_scheduling.py [--rounds R] [--hold S] [--redis URL]

Two stand-in Spaces A and B (``devspaces``, real Gradio apps on 127.0.0.1) and a pool
with a global cap of 8 and A's window fixed at 4. Each round sends 14 requests of
``hold`` seconds pinned to A (10 of them wait), then one 0.2 s request for B, and
measures B's wait (send → result). Side by side in each round, in rotating order:

* **previous rule** — the grant rule before issue 18 (a blocked waiter set aside one
  slot of *every* shared resource it needs), run by the memory store. It is kept here
  only as the yardstick (``_previous_plan``), not in the pool;
* **ours** — the work-conserving rule (``pool/admission/_rule.py``), on the memory,
  SQLite and Redis stores.

Then, per store, the hand-off cost with 500 waiters against 10 (the ``queue`` row of
``scripts/bench.py``, ``_bench_queue.measure``): flat in the queue length is the goal.
Prints a Markdown table; the load average is printed with it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "scripts"), ROOT]
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p
)  # the stand-in Spaces are child processes that import devspaces

from _bench_queue import measure as handoff  # noqa: E402
from _bench_stores import _drop_prefixes, redis_url  # noqa: E402

from devspaces import SpaceFleet  # noqa: E402
from pool import Pool, PoolSettings  # noqa: E402
from pool.admission import MemoryCoordinator, open_coordinator  # noqa: E402
from pool.admission._rule import is_private, limit_lookup  # noqa: E402

BACKLOG = 14


def _previous_plan(
    waiters: Iterable[tuple[str, Sequence[str]]],
    held: Mapping[str, int],
    limit_of: Callable[[str], int],
) -> list[str]:
    """The grant rule before issue 18, one pass: a waiter short of a slot holds one
    slot of each of its shared resources, blocked on it or not."""
    counts, granted = dict(held), []
    for key, resources in waiters:
        if any(is_private(r) and counts.get(r, 0) >= limit_of(r) for r in resources):
            continue
        if all(counts.get(r, 0) < limit_of(r) for r in resources):
            granted.append(key)
            for r in resources:
                counts[r] = counts.get(r, 0) + 1
        else:
            for r in resources:
                if not is_private(r):
                    counts[r] = counts.get(r, 0) + 1
    return granted


class PreviousRule(MemoryCoordinator):
    """The memory store running :func:`_previous_plan` (the yardstick)."""

    def _assign(self) -> None:
        limit_of = limit_lookup(self._limits)
        pending = [(k, w.resources) for k, w in self._waiters.items() if not w.future.done()]
        for key in _previous_plan(pending, self._held, limit_of):
            waiter = self._forget(key)
            assert waiter is not None
            waiter.future.set_result(self._grant(waiter.resources))


async def b_wait(fleet: SpaceFleet, variant: str, url: str, hold_s: float) -> float:
    """One round of the scenario; B's wait in seconds."""
    settings = PoolSettings(
        spaces=fleet.pool_spaces_env(), coordinator_url=url, global_max_concurrent=8,
        window_initial=4, window_grow_after=1000, queue_timeout_s=120, lease_ttl_s=15,
    )  # fmt: skip
    coordinator = PreviousRule() if variant == "previous" else open_coordinator(url)
    pool = Pool(settings, coordinator=coordinator)
    try:
        await pool.start()
        calls = [asyncio.create_task(pool.predict("/echo", "a", hold_s, space="alpha"))
                 for _ in range(BACKLOG)]  # fmt: skip
        while (await coordinator.snapshot()).queued.get("space:alpha", 0) < BACKLOG - 4:
            await asyncio.sleep(0.02)
        sent = time.monotonic()
        await pool.predict("/echo", "b", 0.2, space="beta")
        waited = time.monotonic() - sent
        await asyncio.gather(*calls)
        return waited
    finally:
        await pool.aclose()
        await coordinator.aclose()


def _urls(tmp: str, redis: str | None, prefixes: list[str]) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    urls = {"previous": "memory://", "memory": "memory://",
            "sqlite": f"sqlite:///{os.path.join(tmp, tag)}.db"}  # fmt: skip
    if redis:
        prefixes.append(f"spacepool-bench-sched-{tag}:")
        urls["redis"] = f"{redis}?prefix={prefixes[-1]}"
    return urls


def _fmt(values: list[float], unit: str = "s") -> str:
    return f"{statistics.median(values):.2f} {unit} ({min(values):.2f}–{max(values):.2f})"


async def main(rounds: int, hold_s: float, redis: str | None) -> None:
    waits: dict[str, list[float]] = {}
    prefixes: list[str] = []
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp, SpaceFleet(2) as fleet:
        for r in range(rounds):
            urls = _urls(tmp, redis, prefixes)
            order = list(urls)[r % len(urls):] + list(urls)[: r % len(urls)]
            for variant in order:
                waits.setdefault(variant, []).append(
                    await b_wait(fleet, variant, urls[variant], hold_s)
                )
                loads.append(os.getloadavg()[0])
        steps: dict[str, dict[int, list[float]]] = {}
        for _ in range(2):
            for store, url in _urls(tmp, redis, prefixes).items():
                if store != "previous":
                    for n in (10, 500):
                        step_s, _ = await handoff(
                            url.replace(".db", f"-{n}-{uuid.uuid4().hex[:4]}.db"), n, 100
                        )
                        steps.setdefault(store, {}).setdefault(n, []).append(1000 * step_s)
            loads.append(os.getloadavg()[0])
    if prefixes and redis:
        _drop_prefixes(redis, prefixes)
    print(f"\n{started}, {rounds} rounds, A's requests {hold_s} s, load average "
          f"{statistics.median(loads):.1f} ({min(loads):.1f}–{max(loads):.1f})\n")  # fmt: skip
    print("| scenario | previous rule (memory) | ours: memory | ours: SQLite | ours: Redis |")
    print("|---|---|---|---|---|")
    cells = [_fmt(waits[v]) if v in waits else "—" for v in ("previous", "memory", "sqlite",
                                                              "redis")]  # fmt: skip
    print(f"| B's wait behind A's backlog of 10 (cap 8, A's window 4) | {' | '.join(cells)} |")
    cells = ["—"] + [
        f"{_fmt(steps[s][500], 'ms')} vs {_fmt(steps[s][10], 'ms')} (10 waiters)"
        if s in steps else "—" for s in ("memory", "sqlite", "redis")
    ]  # fmt: skip
    print(f"| hand-off + arrival, 500 waiters (vs 10) | {' | '.join(cells)} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hold", type=float, default=2.0, help="A's request duration (s)")
    parser.add_argument("--redis", default=None, help="Redis URL (default: the bench's)")
    args = parser.parse_args()
    import bench_admission as ba

    redis = args.redis or redis_url()
    asyncio.run(main(args.rounds, args.hold, redis if ba.redis_reachable(redis) else None))
