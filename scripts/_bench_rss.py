"""Row "RSS": memory and threads of a process holding 3 Spaces × N pooled connections.

Each measurement is a fresh child process (this file with ``--child``), so imports
and earlier rows do not count twice:

* ``pool`` — a Pool with ``min_connections = max_connections = N`` on every Space;
  one request per Space starts it, then the child waits until every Space holds N
  connections and reads its RSS and thread count (psutil); then all 3 × N
  connections serve one predict at once (their gradio executors start threads) and
  it reads both again ("after use");
* ``raw`` — the same number of plain ``gradio_client.Client`` objects opened by 16
  threads, one predict on one of them per Space (the yardstick: what the Clients
  themselves weigh, without the pool).

Both report the baseline after imports, so per-connection figures subtract it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path[:0] = [
    os.path.dirname(os.path.abspath(__file__)),
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
]

from _bench_stats import Result, Summary, ratios  # noqa: E402

GOAL_MB = 200.0
MB = 1024 * 1024


def _usage() -> tuple[float, int]:
    import psutil

    proc = psutil.Process()
    return proc.memory_info().rss / MB, proc.num_threads()


async def child_pool(spaces: str, per_space: int, settle_s: float = 1.0) -> dict[str, Any]:
    import gradio_client  # noqa: F401 - counted in the baseline, as in the raw child

    from pool import Pool, PoolSettings

    rss0, threads0 = _usage()
    settings = PoolSettings(
        spaces=spaces,
        coordinator_url="memory://",
        min_connections=per_space,
        max_connections=per_space,
        global_max_concurrent=3 * per_space,
        queue_timeout_s=120,
        connect_timeout_s=60,
    )
    pool = Pool(settings)
    started = time.monotonic()
    for name in pool.spaces:
        async with pool.client(None, space=name) as client:
            await client.predict("x", 0, api_name="/echo")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        stats = await pool.stats()
        if all(p["totalConnections"] >= per_space for p in stats["pools"].values()):
            break
        await asyncio.sleep(0.2)
    opened_s = time.monotonic() - started
    await asyncio.sleep(settle_s)  # let the last opens' threads settle
    stats = await pool.stats()
    rss, threads = _usage()

    async def use(name: str) -> None:
        async with pool.client(None, space=name) as client:
            await client.predict("x", settle_s, api_name="/echo")

    # Every connection serves one predict at once: its executors start their threads.
    await asyncio.gather(*(use(name) for name in pool.spaces for _ in range(per_space)))
    await asyncio.sleep(2.5 * settle_s)  # returned connections settle (stream closed), go idle
    rss_used, threads_used = _usage()
    return {
        "rss0_mb": rss0,
        "threads0": threads0,
        "rss_mb": rss,
        "threads": threads,
        "connections": stats["totalConnections"],
        "open_s": opened_s,
        "rss_used_mb": rss_used,
        "threads_used": threads_used,
        "connections_used": (await pool.stats())["totalConnections"],
    }


def child_raw(spaces: str, per_space: int, settle_s: float = 1.0) -> dict[str, Any]:
    from gradio_client import Client

    from pool import parse_spaces

    rss0, threads0 = _usage()
    urls = [spec.src for spec in parse_spaces([s for s in spaces.split(",") if s])]
    started = time.monotonic()

    def open_one(url: str) -> Any:
        return Client(url, verbose=False, max_workers=2, download_files=False)

    with ThreadPoolExecutor(16) as executor:
        clients = list(executor.map(open_one, [u for u in urls for _ in range(per_space)]))
    for i in range(len(urls)):
        clients[i * per_space].predict("x", 0, api_name="/echo")
    opened_s = time.monotonic() - started
    time.sleep(settle_s)
    rss, threads = _usage()
    return {
        "rss0_mb": rss0,
        "threads0": threads0,
        "rss_mb": rss,
        "threads": threads,
        "connections": len(clients),
        "open_s": opened_s,
    }


def measure(
    mode: str,
    spaces: str,
    per_space: int,
    *,
    settle_s: float = 1.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run one child; its last stdout line is the JSON figures. ``settle_s`` scales the
    child's waits (threads settling after the opens, the predict every connection
    serves, their going idle after it): 1 s for the figures, less for a smoke run."""
    proc = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            mode,
            spaces,
            str(per_space),
            "--settle-s",
            str(settle_s),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"RSS child ({mode}) failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


MODES = ("pool", "raw")


def rss_rows(spaces: str, *, per_space: int, rounds: int, with_raw: bool) -> list[Result]:
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    modes = list(MODES) if with_raw else ["pool"]
    for r in range(rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            runs[mode].append(measure(mode, spaces, per_space))
    n = 3 * per_space
    raw = runs["raw"]
    results: list[Result] = []
    for mode, label in (("pool", "RSS"),):
        got = runs[mode]
        conns = [run["connections"] for run in got]

        def per_conn(key: str, base: str, runs: list[dict[str, Any]] = got) -> float:
            return statistics_median(
                [(run[key] - run[base]) / max(1, run["connections"]) for run in runs]
            )

        note = (
            f"{len(got)} fresh child process(es); connections held {min(conns)}–{max(conns)}; "
            f"after imports {statistics_median([r['rss0_mb'] for r in got]):.0f} MB; per "
            f"connection {per_conn('rss_mb', 'rss0_mb'):.2f} MB idle, "
            f"{per_conn('rss_used_mb', 'rss0_mb'):.2f} MB after use; opening them took "
            f"{statistics_median([r['open_s'] for r in got]):.0f} s"
        )
        for state, key in (("idle", "rss_mb"), ("after each served a predict", "rss_used_mb")):
            values = [run[key] for run in got]
            # Quick mode holds fewer connections: judge the goal on the projection to 150.
            judged = (
                values
                if n == 150
                else [run["rss0_mb"] + 150 * per_conn(key, "rss0_mb", [run]) for run in got]
            )
            idle = state == "idle"
            results.append(
                Result(
                    "rss",
                    f"{label}: {n} pooled connections, {state}",
                    "MB",
                    Summary.of(values),
                    "pool",
                    Summary.of([run["rss_mb"] for run in raw]) if raw and idle else None,
                    f"{n} raw Clients (gradio defaults), 3 used",
                    ratio=Summary.of([m / GOAL_MB for m in judged]),
                    ratio_style="share",
                    goal=f"≤ {GOAL_MB:.0f} MB RSS (ratio: share of it)",
                    met=statistics_median(judged) <= GOAL_MB,
                    note=note
                    + (
                        f"; quick mode: {n} connections, goal judged on the projection to 150"
                        if n != 150
                        else ""
                    ),
                    detail={"runs": got} if idle else {},
                )
            )
        if mode == "pool":
            idle_threads = [float(run["threads"]) for run in got]
            used_threads = [float(run["threads_used"]) for run in got]
            results.append(
                Result(
                    "rss",
                    f"RSS: threads of that process ({n} connections), after use",
                    "threads",
                    Summary.of(used_threads),
                    "pool",
                    Summary.of(idle_threads),
                    "the same, idle",
                    ratio=Summary.of(ratios(used_threads, idle_threads)),
                    goal="bounded; reported",
                    met=None,
                    note=(
                        f"per connection {per_conn('threads', 'threads0'):.2f} threads idle, "
                        f"{per_conn('threads_used', 'threads0'):.2f} after use"
                        + (
                            f" ({statistics_median([float(r['threads']) for r in raw]):.0f} "
                            f"threads for {n} raw Clients, 3 used)"
                            if raw
                            else ""
                        )
                        + ": gradio_client starts one heartbeat thread per Client; a used "
                        "Client keeps its executor, helper and stream-reader threads (one job "
                        "at a time on a leased connection: ~4 more). Bounded by 3 Spaces × "
                        "max_connections × (1 + 3 × client_max_workers + 1) + 16 spacepool-io "
                        "threads"
                    ),
                )
            )
    return results


def statistics_median(values: list[float]) -> float:
    return Summary.of(values).median


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=3, metavar=("MODE", "SPACES", "PER_SPACE"), required=True)
    parser.add_argument("--settle-s", type=float, default=1.0)
    args = parser.parse_args()
    mode, spaces, per_space = args.child[0], args.child[1], int(args.child[2])
    if mode == "pool":
        figures = asyncio.run(child_pool(spaces, per_space, args.settle_s))
    else:
        figures = child_raw(spaces, per_space, args.settle_s)
    print(json.dumps(figures), flush=True)
    os._exit(0)  # do not wait for 150 heartbeat threads to notice anything


if __name__ == "__main__":
    main()
