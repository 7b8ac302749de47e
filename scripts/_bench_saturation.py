"""Row "saturation": many callers, three Spaces, one global cap.

``callers`` tasks start at once, each a different user, each one pooled predict of
``/echo`` lasting ``service_s`` on the Space; the pool admits at most ``cap`` at a
time. Throughput = callers / (last completion − start). Two yardsticks:

* the ideal ``cap / service_s`` (every slot busy every moment with pure service), and
* what the machine gives: ``cap`` raw reused ``gradio_client.Client`` threads (spread
  over the same Spaces, given the one shared SSL context the pool gives its own
  connections) looping the same predict with no admission at all, measured in the
  same repetition — their mean per-call time ``T`` gives ``cap / T``.

The first ratio includes gradio's own per-call cost (queue join + SSE stream, shared
by client and Spaces on one machine); the second is what the pool itself costs.
Admission waits come from the pool's ``admitted`` hook; CPU per call (this process
and the Space processes, psutil) tells the machine's share from ours.

Each Space's admission limit is its adaptive window (AIMD: starts at 4, +1 per 3
successes in a row); the warm-up bursts before the timed rounds let it climb, and the
windows reached are printed in the note, so the timed runs measure the global cap.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil
from _bench_clients import open_raw
from _bench_stats import Result, Summary, percentile, ratios

from devspaces import SpaceFleet
from pool import Pool, PoolEvent, PoolSettings
from pool.transport._fallback import close_client


class CPU:
    """CPU seconds of this process (client side) and of the Spaces (server side)."""

    def __init__(self, fleet: SpaceFleet) -> None:
        self.me = psutil.Process()
        self.spaces = [psutil.Process(space.pid) for space in fleet]

    def read(self) -> tuple[float, float]:
        def used(proc: psutil.Process) -> float:
            times = proc.cpu_times()
            return float(times.user + times.system)

        return used(self.me), sum(used(p) for p in self.spaces)


class _Run:
    def __init__(self) -> None:
        self.waits: list[float] = []
        self.holds: list[float] = []
        self.elapsed = 0.0
        self.errors: list[str] = []

    def hook(self, event: PoolEvent) -> None:
        if event.kind == "admitted":
            self.waits.append(event.seconds)
        elif event.kind == "finished" and event.outcome == "ok":
            self.holds.append(event.seconds)


async def pooled_burst(pool: Pool, callers: int, service_s: float, tag: str) -> _Run:
    run = _Run()
    pool.hooks.append(run.hook)

    async def caller(i: int) -> None:
        try:
            async with pool.client(f"{tag}-{i}@example.com") as client:
                await client.predict(str(i), service_s, api_name="/echo")
        except Exception as exc:
            run.errors.append(f"{type(exc).__name__}: {exc}")

    started = time.perf_counter()
    try:
        await asyncio.gather(*(caller(i) for i in range(callers)))
    finally:
        run.elapsed = time.perf_counter() - started
        pool.hooks.remove(run.hook)
    return run


def raw_burst(clients: list[Any], calls_each: int, service_s: float) -> tuple[float, list[float]]:
    """``len(clients)`` threads, each looping predicts on its own raw Client."""
    times: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(len(clients) + 1)

    def loop(client: Any) -> None:
        start.wait()
        for i in range(calls_each):
            t = time.perf_counter()
            client.predict(str(i), service_s, api_name="/echo")
            with lock:
                times.append(time.perf_counter() - t)

    threads = [threading.Thread(target=loop, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    start.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, times


def _settings(fleet: SpaceFleet, cap: int) -> PoolSettings:
    return PoolSettings(
        spaces=fleet.pool_spaces_env(),
        coordinator_url="memory://",
        global_max_concurrent=cap,
        consumer_max_concurrent=2,
        min_connections=2,
        max_connections=50,
        queue_timeout_s=600,
    )


POOL = "pool"
RAW = "raw"


@dataclass
class _Variants:
    """Per repetition: pooled runs, raw bursts and CPU per call, by variant name."""

    pooled: dict[str, list[_Run]] = field(default_factory=lambda: {POOL: []})
    raw: dict[str, list[tuple[float, list[float]]]] = field(default_factory=lambda: {RAW: []})
    cpu_ms: dict[str, list[tuple[float, float]]] = field(
        default_factory=lambda: {v: [] for v in (POOL, RAW)}
    )
    peaks: list[int] = field(default_factory=list)
    opened: list[int] = field(default_factory=list)
    windows: dict[str, int] = field(default_factory=dict)


async def saturation_rows(
    fleet: SpaceFleet, *, callers: int, cap: int, service_s: float, rounds: int, raw_calls: int
) -> list[Result]:
    settings = _settings(fleet, cap)
    pools = {POOL: Pool(settings)}
    urls = [space.url for space in fleet]
    raws = {
        RAW: await asyncio.gather(
            *(asyncio.to_thread(open_raw, urls[i % len(urls)], shared_ssl=True) for i in range(cap))
        )
    }
    v = _Variants()
    cpu = CPU(fleet)
    order = [RAW, POOL]
    try:
        for pool in pools.values():  # connections open lazily, windows start low: warm up
            for k in range(3):
                await pooled_burst(pool, 2 * cap, 0.05, f"warm{k}")
            v.windows = {name: pool.board.get(name).window for name in pool.spaces}
        for clients in raws.values():
            await asyncio.to_thread(raw_burst, clients, 1, 0.05)
        for r in range(rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                for space in fleet:
                    space.reset()
                client0, server0 = cpu.read()
                if name in raws:
                    burst = await asyncio.to_thread(raw_burst, raws[name], raw_calls, service_s)
                    v.raw[name].append(burst)
                    calls = len(burst[1])
                else:
                    pool = pools[name]
                    before = sum(sp.opened_total for sp in pool.spaces.values())
                    v.pooled[name].append(await pooled_burst(pool, callers, service_s, f"r{r}"))
                    v.opened.append(sum(sp.opened_total for sp in pool.spaces.values()) - before)
                    v.peaks.append(fleet_peak(fleet))
                    calls = callers
                client1, server1 = cpu.read()
                v.cpu_ms[name].append(
                    (1000 * (client1 - client0) / calls, 1000 * (server1 - server0) / calls)
                )
    finally:
        for pool in pools.values():
            await pool.aclose()
        for clients in raws.values():
            for client in clients:
                close_client(client)
    return _results(
        v, callers=callers, cap=cap, service_s=service_s, rounds=rounds, raw_calls=raw_calls
    )


def _results(
    v: _Variants, *, callers: int, cap: int, service_s: float, rounds: int, raw_calls: int
) -> list[Result]:
    ideal = cap / service_s
    errors = sum(len(run.errors) for runs in v.pooled.values() for run in runs)
    common = (
        f"{callers} callers (distinct users) at once, 3 Spaces, cap G = {cap}, service S = "
        f"{service_s:g} s, {rounds} rounds; errors {errors}; most calls in flight at once on the "
        f"3 Spaces {max(v.peaks, default=0)} (cap {cap}); connections opened in the timed runs "
        f"{sum(v.opened)}; Space windows after the warm-up "
        + ", ".join(f"{name} {w}" for name, w in v.windows.items())
    )
    results: list[Result] = []
    for pool_name, raw_name, label in ((POOL, RAW, "saturation"),):
        runs = v.pooled[pool_name]
        throughput = [callers / run.elapsed for run in runs]
        raw_mean_s = [statistics.fmean(times) for _, times in v.raw[raw_name]]
        machine = [cap / t for t in raw_mean_s]
        raw_throughput = [len(times) / elapsed for elapsed, times in v.raw[raw_name]]
        holds = [statistics.fmean(run.holds) if run.holds else float("nan") for run in runs]
        share = Summary.of([t / ideal for t in throughput])
        vs_machine = Summary.of(ratios(throughput, machine))
        what = "the pool as shipped"
        results.append(
            Result(
                "saturation",
                f"{label}: throughput vs ideal G/S",
                "/s",
                Summary.of(throughput),
                "pool",
                Summary(ideal, ideal, ideal, 1),
                f"G/S = {cap}/{service_s:g} s",
                ratio=share,
                ratio_style="share",
                goal="≥ 95 % of G/S",
                met=errors == 0 and share.median >= 0.95,
                note=f"{what}; {common}",
                detail={"elapsed_s": [run.elapsed for run in runs]},
            )
        )
        results.append(
            Result(
                "saturation",
                f"{label}: throughput vs {cap} raw Clients",
                "/s",
                Summary.of(throughput),
                "pool",
                Summary.of(machine),
                f"{cap} / mean raw call",
                ratio=vs_machine,
                ratio_style="share",
                goal="≥ 95 % (the pool's own share)",
                met=errors == 0 and vs_machine.median >= 0.95,
                note=(
                    f"{cap} raw Client threads (shared SSL context, as the pool's) × "
                    f"{raw_calls} calls: "
                    f"mean call {1000 * statistics.median(raw_mean_s):.0f} ms for a "
                    f"{1000 * service_s:.0f} ms service, closed-loop "
                    f"{statistics.median(raw_throughput):.1f}/s; pool mean hold "
                    f"{1000 * statistics.median(holds):.0f} ms (admitted → released); CPU per "
                    f"call, client + Spaces: raw {_cpu(v.cpu_ms[raw_name])}, pool "
                    f"{_cpu(v.cpu_ms[pool_name])}; all {os.cpu_count()} CPUs could carry "
                    f"{_ceiling(v.cpu_ms[raw_name]):.0f} predicts/s at the raw cost"
                ),
                detail={
                    "raw_mean_call_s": raw_mean_s,
                    "raw_throughput": raw_throughput,
                    "pool_mean_hold_s": holds,
                    "cpu_ms_per_call_client_server": {
                        raw_name: v.cpu_ms[raw_name],
                        pool_name: v.cpu_ms[pool_name],
                    },
                },
            )
        )
    runs = v.pooled[POOL]
    p99 = [percentile(run.waits, 99) for run in runs]
    p50 = [percentile(run.waits, 50) for run in runs]
    holds = [statistics.fmean(run.holds) if run.holds else float("nan") for run in runs]
    # A perfect FIFO with every slot busy: caller k waits floor(k / G) holds.
    ideal_p99 = [(int(0.99 * callers) // cap) * hold for hold in holds]
    results.append(
        Result(
            "saturation",
            "saturation: admission wait p99",
            "s",
            Summary.of(p99),
            "pool",
            Summary.of(ideal_p99),
            "perfect FIFO at the measured hold",
            ratio=Summary.of(ratios(p99, ideal_p99)),
            goal="reported",
            met=None,
            note=(
                f"all {callers} callers arrive at once, so the p99 caller queues behind "
                f"~{int(0.99 * callers) // cap} waves of holds; wait p50 "
                f"{statistics.median(p50):.2f} s"
            ),
            detail={"wait_p50_s": p50, "wait_p99_s": p99},
        )
    )
    return results


def fleet_peak(fleet: SpaceFleet) -> int:
    """Most calls running at once across the fleet, from the Spaces' own call intervals."""
    edges = sorted(
        (t, step)
        for space in fleet
        for start, end in space.intervals()
        for t, step in ((start, 1), (end, -1))
    )  # at equal times the end (-1) sorts first: touching calls do not overlap
    peak = running = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def _cpu(pairs: list[tuple[float, float]]) -> str:
    client = statistics.median(p[0] for p in pairs)
    server = statistics.median(p[1] for p in pairs)
    return f"{client:.0f} + {server:.0f} ms"


def _ceiling(pairs: list[tuple[float, float]]) -> float:
    """Predicts per second that all of this machine's CPUs could carry at that cost."""
    per_call_s = statistics.median(p[0] + p[1] for p in pairs) / 1000
    return (os.cpu_count() or 1) / per_call_s if per_call_s else float("nan")
