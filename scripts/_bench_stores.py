"""Rows "SQLite / Redis": the shared stores, measured by ``scripts/bench_admission.py``.

That script (its own author's; imported, not copied) measures, per store and for 1
and 4 processes, acquire+release cycles per second (8 tasks per process looping on
``backend:global`` + a Space, limit 4 per process) and the hand-off latency (limit 1,
4 contenders holding 1 ms; next grant minus previous release). Here it runs in
repetitions, SQLite and Redis interleaved, each on a fresh database / key prefix.
"""

from __future__ import annotations

import math
import os
import tempfile
import uuid
from typing import Any

from _bench_stats import Result, Summary, not_measured, percentile

GOAL_CYCLES = {"sqlite": 1000.0, "redis": 5000.0}
GOAL_HANDOFF_P99_MS = 20.0
NAMES = {"sqlite": "SQLite", "redis": "Redis"}


def redis_url() -> str:
    return os.environ.get("SPACEPOOL_BENCH_REDIS", "redis://127.0.0.1:6379/0")


async def store_rows(*, rounds: int, seconds: float) -> list[Result]:
    try:
        import bench_admission as ba
    except ImportError as exc:  # the other half of issue 6 is not there yet
        why = f"scripts/bench_admission.py not importable: {exc}"
        return [
            not_measured("stores", f"{NAMES[s]}, {n} process(es)", "", why)
            for s in GOAL_CYCLES
            for n in (1, 4)
        ]
    base = redis_url()
    stores = ["sqlite"]
    skipped: list[Result] = []
    if ba.redis_reachable(base):
        stores.append("redis")
    else:
        skipped = [
            not_measured("stores", f"Redis, {n} process(es)", "", f"no Redis at {base}")
            for n in (1, 4)
        ]
    samples: dict[tuple[str, int], list[Any]] = {(s, n): [] for s in stores for n in (1, 4)}
    prefixes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for n in (1, 4):
                for store in stores if r % 2 == 0 else stores[::-1]:
                    tag = uuid.uuid4().hex[:8]
                    if store == "sqlite":
                        url = f"sqlite:///{tmp}/bench-{tag}.db"
                    else:
                        prefixes.append(f"spacepool-bench-{tag}:")
                        url = f"{base}?prefix={prefixes[-1]}"
                    if n == 1:
                        row = await ba.measure_in_process(store, url, seconds)
                    else:
                        row = await ba.measure_fleet(store, url, n, seconds)
                    samples[(store, n)].append(row)
    if prefixes:
        _drop_prefixes(base, prefixes)
    results: list[Result] = []
    for (store, n), rows in samples.items():
        label = f"{NAMES[store]}, {n} process{'es' if n > 1 else ''}"
        goal = GOAL_CYCLES[store]
        cycles = Summary.of([row.cycles_per_s for row in rows])
        latencies = [lat for row in rows for lat in row.latencies_ms]
        p99s = [percentile(row.latencies_ms, 99) for row in rows]
        p50s = [percentile(row.latencies_ms, 50) for row in rows]
        p99_all = percentile(latencies, 99)
        common = f"{rounds} rounds × {seconds:g} s per phase; {len(latencies)} hand-offs in all"
        results.append(
            Result(
                "stores",
                f"{label}: acquire+release",
                "/s",
                cycles,
                "cycles",
                Summary(goal, goal, goal, 1),
                "goal",
                ratio=Summary.of([row.cycles_per_s / goal for row in rows]),
                goal=f"≥ {goal:,.0f}/s",
                met=cycles.median >= goal,
                note=common,
                detail={"cycles_per_s": [row.cycles_per_s for row in rows]},
            )
        )
        results.append(
            Result(
                "stores",
                f"{label}: hand-off p99",
                "ms",
                Summary.of(p99s),
                "p99 per round",
                Summary.of(p50s),
                "p50 per round",
                ratio=Summary.of([p / GOAL_HANDOFF_P99_MS for p in p99s]),
                goal=f"p99 ≤ {GOAL_HANDOFF_P99_MS:.0f} ms (ratio: p99 / goal)",
                met=not math.isnan(p99_all) and Summary.of(p99s).median <= GOAL_HANDOFF_P99_MS,
                note=f"{common}; p99 over all rounds {p99_all:.2f} ms",
                detail={"latencies_ms": [row.latencies_ms for row in rows]},
            )
        )
    return results + skipped


def _drop_prefixes(url: str, prefixes: list[str]) -> None:
    import redis

    with redis.Redis.from_url(url) as client:
        for prefix in prefixes:
            keys = list(client.scan_iter(match=prefix + "*"))
            if keys:
                client.delete(*keys)
