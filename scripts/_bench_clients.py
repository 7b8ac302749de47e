"""Rows "fresh Client" and "raw Client": one warm pooled predict against the old ways.

The approach of ``scripts/bench_connect.py``, in repetitions: each round makes
``per_round`` calls of every variant, interleaved call by call and with the order
alternating (ABBA), so the machine's noise hits every variant alike.

* fresh  — a new ``gradio_client.Client`` per call, one predict, close (no pool),
  with gradio's defaults, as code without the pool does it;
* raw    — one reused raw ``Client`` (``asyncio.to_thread(client.predict, ...)``),
  twice: with gradio's defaults (an SSL context built per HTTP request) and with the
  one shared SSL context that the pool gives its connections
  (``pool.connections._connection.shared_ssl_context``) — the pool's overhead is judged against
  the latter, the same Client set up the same way;
* pooled — ``async with pool.client(email, space=...)`` + ``await predict(...)``,
  in-process admission (``memory://``) and, for the overhead row, the default
  SQLite store as well.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _bench_stats import Result, Summary, ratios

from devspaces import SpaceProcess
from pool import Pool, PoolSettings
from pool.transport._fallback import close_client, shared_ssl_context

EMAIL = "bench@example.com"
Call = Callable[[int], Awaitable[None]]


def open_raw(url: str, *, shared_ssl: bool = False) -> Any:
    """A plain reused Client, as a user without the pool would hold one."""
    from gradio_client import Client

    extra: dict[str, Any] = {"ssl_verify": shared_ssl_context()} if shared_ssl else {}
    return Client(url, verbose=False, max_workers=2, download_files=False, **extra)


def make_pool(url: str, coordinator_url: str = "memory://") -> Pool:
    settings = PoolSettings(
        spaces=f"alpha={url}",
        coordinator_url=coordinator_url,
        min_connections=1,
        queue_timeout_s=60,
    )
    return Pool(settings)


def pooled_call(pool: Pool) -> Call:
    async def call(i: int) -> None:
        async with pool.client(EMAIL, space="alpha") as client:
            await client.predict(str(i), 0, api_name="/echo")

    return call


def raw_call(client: Any) -> Call:
    async def call(i: int) -> None:
        await asyncio.to_thread(client.predict, str(i), 0, api_name="/echo")

    return call


def fresh_call(url: str) -> Call:
    async def call(i: int) -> None:
        client = await asyncio.to_thread(open_raw, url)
        try:
            await asyncio.to_thread(client.predict, str(i), 0, api_name="/echo")
        finally:
            await asyncio.to_thread(close_client, client)

    return call


async def interleaved(
    variants: dict[str, Call], rounds: int, per_round: int
) -> dict[str, list[list[float]]]:
    """Seconds per call: ``times[variant][round][i]``, variants interleaved ABBA."""
    names = list(variants)
    times: dict[str, list[list[float]]] = {name: [] for name in names}
    i = 0
    for _ in range(rounds):
        for name in names:
            times[name].append([])
        for k in range(per_round):
            order = names if k % 2 == 0 else names[::-1]
            for name in order:
                started = time.perf_counter()
                await variants[name](i)
                times[name][-1].append(time.perf_counter() - started)
                i += 1
    return times


def _round_medians(rounds: list[list[float]]) -> list[float]:
    return [statistics.median(r) * 1000 for r in rounds]


def _all_ms(rounds: list[list[float]]) -> list[float]:
    return [v * 1000 for r in rounds for v in r]


async def fresh_rows(space: SpaceProcess, *, rounds: int, per_round: int) -> list[Result]:
    """Pooled predict vs a new Client per call, /config answered after 0 ms and 500 ms."""
    results: list[Result] = []
    pool = make_pool(space.url)
    try:
        for delay_ms, goal in ((0, 1.5), (500, 5.0)):
            space.control(config_delay_s=delay_ms / 1000)
            for i in range(3):  # warm the pool (and its settling connections)
                await pooled_call(pool)(i)
            variants = {"fresh": fresh_call(space.url), "pooled": pooled_call(pool)}
            times = await interleaved(variants, rounds, per_round)
            fresh, pooled = _all_ms(times["fresh"]), _all_ms(times["pooled"])
            p50 = statistics.median(fresh) / statistics.median(pooled)
            ratio = Summary.of(
                ratios(_round_medians(times["fresh"]), _round_medians(times["pooled"]))
            )
            results.append(
                Result(
                    "fresh",
                    f"fresh Client, /config after {delay_ms} ms",
                    "ms",
                    Summary.of(pooled),
                    "pooled predict",
                    Summary.of(fresh),
                    "new Client per call",
                    ratio=Summary(p50, ratio.low, ratio.high, ratio.n),
                    goal=f"fresh/pooled ≥ {goal:g}× (p50)",
                    met=p50 >= goal,
                    note=(
                        f"{rounds} rounds × {per_round} calls per variant (interleaved); "
                        "ratio = p50 of all calls, min–max = per-round p50 ratios"
                    ),
                    detail={"samples_s": times, "config_delay_ms": delay_ms},
                )
            )
    finally:
        space.control(config_delay_s=0.0)
        await pool.aclose()
    return results


async def raw_rows(space: SpaceProcess, *, rounds: int, per_round: int) -> list[Result]:
    """Pooled predict (memory and SQLite admission) vs one reused raw Client."""
    raw = await asyncio.to_thread(open_raw, space.url)
    raw_tls = await asyncio.to_thread(open_raw, space.url, shared_ssl=True)
    with tempfile.TemporaryDirectory() as tmp:
        pools = {
            "pooled (memory)": make_pool(space.url),
            "pooled (sqlite)": make_pool(space.url, f"sqlite:///{tmp}/bench.db"),
        }
        try:
            for pool in pools.values():
                for i in range(3):
                    await pooled_call(pool)(i)
            await raw_call(raw)(0)
            await raw_call(raw_tls)(0)
            variants: dict[str, Call] = {"raw": raw_call(raw), "raw + TLS": raw_call(raw_tls)}
            variants.update({name: pooled_call(pool) for name, pool in pools.items()})
            times = await interleaved(variants, rounds, per_round)
        finally:
            for pool in pools.values():
                await pool.aclose()
            close_client(raw)
            close_client(raw_tls)
    results = []
    for name, store, base_name in (
        ("pooled (memory)", "memory", "raw + TLS"),
        ("pooled (sqlite)", "SQLite", "raw + TLS"),
        ("pooled (memory)", "memory", "raw"),
    ):
        ours, base = _all_ms(times[name]), _all_ms(times[base_name])
        p50 = statistics.median(ours) / statistics.median(base)
        per_round_ratio = Summary.of(
            ratios(_round_medians(times[name]), _round_medians(times[base_name]))
        )
        judged = base_name == "raw + TLS"
        results.append(
            Result(
                "raw",
                f"raw Client, pool with {store} admission"
                + ("" if judged else ", vs a raw Client with gradio's defaults"),
                "ms",
                Summary.of(ours),
                "pooled predict",
                Summary.of(base),
                "raw reused Client" + (" (shared TLS context)" if judged else " (defaults)"),
                ratio=Summary(p50, per_round_ratio.low, per_round_ratio.high, per_round_ratio.n),
                ratio_style="overhead",
                goal="pool overhead ≤ 5 % of p50" if judged else "reported",
                met=p50 <= 1.05 if judged else None,
                note=(
                    f"{rounds} rounds × {per_round} calls per variant, 4 variants interleaved, "
                    f"/config 0 ms; p50 difference "
                    f"{statistics.median(ours) - statistics.median(base):+.1f} ms"
                    + (
                        "; the raw Client is set up as the pool sets up its connections "
                        "(one shared SSL context)"
                        if judged
                        else "; gradio's default builds an SSL context per HTTP request"
                    )
                ),
                detail={"samples_s": {k: times[k] for k in (base_name, name)}},
            )
        )
    return results
