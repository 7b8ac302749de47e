"""Rows "fresh Client" and "raw Client": one warm pooled predict against the old ways.

The approach of ``scripts/bench_connect.py``, in repetitions: each round makes
``per_round`` calls of every variant, interleaved call by call and with the order
alternating (ABBA), so the machine's noise hits every variant alike.

* fresh  — a new ``gradio_client.Client`` per call, one predict, close (no pool);
* raw    — one reused raw ``Client`` (``asyncio.to_thread(client.predict, ...)``);
* pooled — ``async with pool.client(email, space=...)`` + ``await predict(...)``,
  in-process admission (``memory://``) and, for the overhead row, the default
  SQLite store as well.
"""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from _bench_stats import Result, Summary, ratios

from devspaces import SpaceProcess
from pool import Pool, PoolSettings
from pool._connection import ClientFactory, close_client

EMAIL = "bench@example.com"
Call = Callable[[int], Awaitable[None]]


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """The context httpx builds for ``verify=True``, built once for the process.

    gradio_client passes ``verify=client.ssl_verify`` to every httpx call it makes,
    and httpx then builds a new SSL context — loading certifi's CA bundle, even for
    ``http://`` — for every request (≈ 35 ms of CPU here, three times per predict).
    An ``SSLContext`` passed as ``ssl_verify`` is used as is: same verification,
    no rebuild. This is the proposed fix measured by the "what-if" variants.
    """
    import certifi

    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    return ssl.create_default_context(cafile=certifi.where())


def open_raw(url: str, *, shared_ssl: bool = False) -> Any:
    """A plain reused Client, as a user without the pool would hold one."""
    from gradio_client import Client

    extra: dict[str, Any] = {"ssl_verify": shared_ssl_context()} if shared_ssl else {}
    return Client(url, verbose=False, max_workers=2, download_files=False, **extra)


def proposed_factory(settings: PoolSettings) -> ClientFactory:
    """``pool._connection.gradio_factory`` plus the shared SSL context (what-if rows)."""
    from gradio_client import Client

    token = settings.hf_token.get_secret_value() if settings.hf_token else None
    timeout = httpx.Timeout(settings.connect_timeout_s, read=settings.read_timeout_s)

    def open_client(src: str) -> Any:
        return Client(
            src,
            token=token,
            max_workers=settings.client_max_workers,
            verbose=False,
            download_files=False,
            analytics_enabled=False,
            httpx_kwargs={"timeout": timeout},
            ssl_verify=shared_ssl_context(),
        )

    return open_client


def make_pool(url: str, coordinator_url: str = "memory://", *, fix: bool = False) -> Pool:
    settings = PoolSettings(
        spaces=f"alpha={url}",
        coordinator_url=coordinator_url,
        min_connections=1,
        queue_timeout_s=60,
    )
    return Pool(settings, client_factory=proposed_factory(settings) if fix else None)


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
    """Pooled predict vs a new Client per call, /config answered after 0 ms and 500 ms.

    A third variant, interleaved with the two, is the what-if: the pool given one
    shared SSL context (``proposed_factory``).
    """
    results: list[Result] = []
    pools = {"pooled": make_pool(space.url), "pooled + fix": make_pool(space.url, fix=True)}
    try:
        for delay_ms, goal in ((0, 1.5), (500, 5.0)):
            space.control(config_delay_s=delay_ms / 1000)
            for pool in pools.values():
                for i in range(3):  # warm the pool (and its settling connections)
                    await pooled_call(pool)(i)
            variants = {"fresh": fresh_call(space.url)}
            variants.update({name: pooled_call(pool) for name, pool in pools.items()})
            times = await interleaved(variants, rounds, per_round)
            fresh = _all_ms(times["fresh"])
            for name, label in (("pooled", ""), ("pooled + fix", ", what-if shared SSL context")):
                pooled = _all_ms(times[name])
                p50 = statistics.median(fresh) / statistics.median(pooled)
                ratio = Summary.of(
                    ratios(_round_medians(times["fresh"]), _round_medians(times[name]))
                )
                results.append(
                    Result(
                        "fresh",
                        f"fresh Client, /config after {delay_ms} ms{label}",
                        "ms",
                        Summary.of(pooled),
                        "pooled + fix" if name == "pooled + fix" else "pooled predict",
                        Summary.of(fresh),
                        "new Client per call",
                        ratio=Summary(p50, ratio.low, ratio.high, ratio.n),
                        goal=f"fresh/pooled ≥ {goal:g}× (p50)",
                        met=p50 >= goal,
                        note=(
                            f"{rounds} rounds × {per_round} calls per variant (fresh, pooled, "
                            "pooled + fix interleaved); ratio = p50 of all calls, min–max = "
                            "per-round p50 ratios"
                        ),
                        detail={
                            "samples_s": {k: times[k] for k in ("fresh", name)},
                            "config_delay_ms": delay_ms,
                        },
                    )
                )
    finally:
        space.control(config_delay_s=0.0)
        for pool in pools.values():
            await pool.aclose()
    return results


async def raw_rows(space: SpaceProcess, *, rounds: int, per_round: int) -> list[Result]:
    """Pooled predict (memory and SQLite admission) vs one reused raw Client."""
    raw = await asyncio.to_thread(open_raw, space.url)
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
            variants: dict[str, Call] = {"raw": raw_call(raw)}
            variants.update({name: pooled_call(pool) for name, pool in pools.items()})
            times = await interleaved(variants, rounds, per_round)
        finally:
            for pool in pools.values():
                await pool.aclose()
            close_client(raw)
    base = _all_ms(times["raw"])
    results = []
    for name, store in (("pooled (memory)", "memory"), ("pooled (sqlite)", "SQLite")):
        ours = _all_ms(times[name])
        p50 = statistics.median(ours) / statistics.median(base)
        per_round_ratio = Summary.of(
            ratios(_round_medians(times[name]), _round_medians(times["raw"]))
        )
        results.append(
            Result(
                "raw",
                f"raw Client, pool with {store} admission",
                "ms",
                Summary.of(ours),
                "pooled predict",
                Summary.of(base),
                "raw reused Client",
                ratio=Summary(p50, per_round_ratio.low, per_round_ratio.high, per_round_ratio.n),
                ratio_style="overhead",
                goal="pool overhead ≤ 5 % of p50",
                met=p50 <= 1.05,
                note=(
                    f"{rounds} rounds × {per_round} calls per variant, /config 0 ms; "
                    f"p50 difference {statistics.median(ours) - statistics.median(base):+.1f} ms"
                ),
                detail={"samples_s": {k: times[k] for k in ("raw", name)}},
            )
        )
    return results
