"""Client construction vs a warm pooled predict, side by side, on local stand-in Spaces.

For each ``/config`` delay (0 ms, and a Hub-like 500 ms) it measures, interleaved so
the machine's noise hits all three alike:

* fresh  — a new ``gradio_client.Client`` per call, then one predict, then close (the old way)
* raw    — one reused raw ``Client`` calling the same Space
* pooled — ``async with pool.client(): await predict(...)`` on a warm pool

    .venv/bin/python scripts/bench_connect.py [--reps 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devspaces import SpaceProcess
from pool import Pool, PoolSettings
from pool.transport._fallback import close_client


def _client(url: str) -> Any:
    from gradio_client import Client

    return Client(url, verbose=False, max_workers=2, download_files=False)


async def bench(url: str, reps: int) -> dict[str, list[float]]:
    pool = Pool(PoolSettings(spaces=f"s={url}", coordinator_url="memory://", min_connections=1))
    raw = await asyncio.to_thread(_client, url)
    times: dict[str, list[float]] = {"fresh": [], "raw": [], "pooled": []}
    async with pool.client() as c:  # warm up
        await c.predict("w", 0, api_name="/echo")
    for i in range(reps):
        t = time.perf_counter()
        fresh = await asyncio.to_thread(_client, url)
        await asyncio.to_thread(fresh.predict, str(i), 0, api_name="/echo")
        times["fresh"].append(time.perf_counter() - t)
        await asyncio.to_thread(close_client, fresh)

        t = time.perf_counter()
        await asyncio.to_thread(raw.predict, str(i), 0, api_name="/echo")
        times["raw"].append(time.perf_counter() - t)

        t = time.perf_counter()
        async with pool.client() as c:
            await c.predict(str(i), 0, api_name="/echo")
        times["pooled"].append(time.perf_counter() - t)
    close_client(raw)
    await pool.aclose()
    return times


def summary(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return f"{statistics.median(ms):7.1f} ms  ({ms[0]:.1f}–{ms[-1]:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with SpaceProcess("bench") as space:
        for delay in (0.0, 0.5):
            space.control(config_delay_s=delay)
            times = asyncio.run(bench(space.url, args.reps))
            med = {k: statistics.median(v) for k, v in times.items()}
            results[f"{int(delay * 1000)}ms"] = {"median_s": med, "samples_s": times}
            print(f"/config delay {int(delay * 1000)} ms, {args.reps} reps (median, min–max):")
            for name, values in times.items():
                print(f"  {name:7s} {summary(values)}")
            print(
                f"  fresh/pooled = {med['fresh'] / med['pooled']:.2f}x   "
                f"pool overhead vs raw = {100 * (med['pooled'] / med['raw'] - 1):+.1f} %"
            )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
