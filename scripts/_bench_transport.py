"""Row "transport": the pool on each of its transports against a raw reused Client.

The transports are the values of ``PoolSettings.transport`` (env ``POOL_TRANSPORT``):
"gradio_client" (today's path: a synchronous ``gradio_client.Client`` per connection)
and "native" (the asyncio implementation of the protocol). A pool whose settings have
no ``transport`` field is measured on the one path it has, "gradio_client". The
yardstick is always one raw reused ``gradio_client.Client`` with the shared SSL context
the pool gives its own connections (``_bench_clients.open_raw``).

Figures, every variant in the same run, interleaved where they share a Space:

* **0 s predict p50** — ``/echo`` with a 0 s service, one call at a time, variants
  interleaved call by call (ABBA); per-round p50s and their ratio to raw (goal for the
  native transport: ≤ 0.5× raw);
* **saturation** — ``_bench_saturation.pooled_burst``: many distinct users at once over
  three Spaces behind a global cap G, service S; throughput as a share of G/S (goal ≥ 97 %),
  counted on the Spaces' own clock: the calls they ran × S over G × (their last call's
  end − their first call's start), from the intervals the Spaces record. The pool's view
  (callers over the burst's wall time, which adds the first admission and the last
  result's way back) is printed beside it, with the TCP connections the Spaces saw;
* **threads / RSS of a process holding 150 used connections** — ``_bench_rss.measure``
  in a fresh child (``POOL_TRANSPORT`` set for it): 3 Spaces × 50 connections, every
  one having served a predict (goals ≤ 20 threads, ≤ 60 MB); the raw yardstick is
  the same number of plain Clients, 3 of them used;
* **first partial** — a ``stream`` stand-in yields partials stamped with the Space's
  ``time.time()`` (one host, one clock); the lag of the first partial reaching the
  caller behind that stamp: raw = ``for out in client.submit(...)`` (gradio_client's
  own 1 ms spin) in a thread, pool = ``async for out in job.stream()`` (goal ≤ 5 ms).
  Each call draws its pace from 50 ms + U(0, 50 ms), so gradio_client's 50 ms poll
  phase is spread alike over the variants (see ``scripts/bench_stream.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from _bench_clients import interleaved, open_raw, pooled_call, raw_call
from _bench_rss import measure as rss_child
from _bench_saturation import CPU, pooled_burst
from _bench_saturation import _settings as saturation_settings
from _bench_stats import Result, Summary, ratios

from devspaces import SpaceFleet, SpaceProcess
from pool import Pool, PoolSettings
from pool.transport._fallback import close_client

NATIVE = "native"
GRADIO_CLIENT = "gradio_client"
PREDICT_GOAL = 0.5  # native p50 ≤ 0.5 × raw
SATURATION_GOAL = 0.97
THREADS_GOAL = 20
RSS_GOAL_MB = 60.0
PARTIAL_GOAL_MS = 5.0
HELD = 150  # connections the threads/RSS goals are stated for


@dataclass(frozen=True)
class TransportPlan:
    """Repetitions and sizes of the transport row."""

    predict_rounds: int
    predict_per_round: int
    sat_callers: int
    sat_cap: int
    sat_service_s: float
    sat_rounds: int
    sat_warmups: int
    rss_per_space: int
    partial_rounds: int
    partial_per_round: int
    # The RSS children's waits (``_bench_rss.measure``'s settle_s), and whether the three
    # run at once (each measures only itself; the figures' run keeps them one by one).
    rss_settle_s: float = 1.0
    rss_at_once: bool = False


FULL = TransportPlan(
    predict_rounds=5, predict_per_round=20,
    sat_callers=240, sat_cap=12, sat_service_s=0.5, sat_rounds=2, sat_warmups=3,
    rss_per_space=50,
    partial_rounds=4, partial_per_round=10,
)  # fmt: skip
QUICK = TransportPlan(
    predict_rounds=2, predict_per_round=6,
    sat_callers=36, sat_cap=12, sat_service_s=0.5, sat_rounds=1, sat_warmups=2,
    rss_per_space=8,
    partial_rounds=2, partial_per_round=4,
)  # fmt: skip
SMOKE = TransportPlan(
    predict_rounds=1, predict_per_round=3,
    sat_callers=12, sat_cap=6, sat_service_s=0.2, sat_rounds=1, sat_warmups=1,
    rss_per_space=2,
    partial_rounds=1, partial_per_round=2,
    rss_settle_s=0.25, rss_at_once=True,
)  # fmt: skip
PLANS = {"full": FULL, "quick": QUICK, "smoke": SMOKE}


def transports() -> list[str]:
    """The transports this pool has: "gradio_client", and "native" once it exists."""
    if "transport" in PoolSettings.model_fields:
        return [GRADIO_CLIENT, NATIVE]
    return [GRADIO_CLIENT]


def on_transport(settings: PoolSettings, transport: str) -> PoolSettings:
    """``settings`` with ``transport`` (unchanged where the setting does not exist)."""
    if "transport" not in PoolSettings.model_fields:
        return settings
    values = {name: getattr(settings, name) for name in PoolSettings.model_fields}
    values["transport"] = transport
    return PoolSettings(**values)


def _goal(transport: str, text: str) -> str:
    return text if transport == NATIVE else "reported (goal is native's)"


def _met(transport: str, ok: bool) -> bool | None:
    return ok if transport == NATIVE else None


def one_space_pools(name: str, url: str) -> dict[str, Pool]:
    """A pool over the one Space ``name`` per transport, in-process admission."""
    settings = PoolSettings(
        spaces=f"{name}={url}", coordinator_url="memory://", min_connections=1, queue_timeout_s=60
    )
    return {t: Pool(on_transport(settings, t)) for t in transports()}


# 0 s predict ------------------------------------------------------------------------


async def predict_rows(space: SpaceProcess, plan: TransportPlan) -> list[Result]:
    raw = await asyncio.to_thread(open_raw, space.url, shared_ssl=True)
    pools = one_space_pools("alpha", space.url)
    try:
        variants = {"raw": raw_call(raw)} | {t: pooled_call(p) for t, p in pools.items()}
        for call in variants.values():  # warm: connections, windows, first-call costs
            for i in range(3):
                await call(i)
        times = await interleaved(variants, plan.predict_rounds, plan.predict_per_round)
    finally:
        for p in pools.values():
            await p.aclose()
        await asyncio.to_thread(close_client, raw)
    raw_p50 = [1000 * statistics.median(r) for r in times["raw"]]
    results = []
    for t in pools:
        p50 = [1000 * statistics.median(r) for r in times[t]]
        share = Summary.of(ratios(p50, raw_p50))
        results.append(
            Result(
                "transport",
                f"transport {t}: 0 s predict p50",
                "ms",
                Summary.of(p50),
                "pool",
                Summary.of(raw_p50),
                "raw reused Client",
                ratio=share,
                goal=_goal(t, f"≤ {PREDICT_GOAL:g}× raw"),
                met=_met(t, share.median <= PREDICT_GOAL),
                note=(
                    f"{plan.predict_rounds} rounds × {plan.predict_per_round} calls per "
                    "variant, interleaved; figures are per-round p50s"
                ),
                detail={"samples_s": {"raw": times["raw"], t: times[t]}},
            )
        )
    return results


# saturation -------------------------------------------------------------------------


class TcpSeen:
    """The TCP connections to ``ports`` that this host opened while it runs: their
    client ports, read from ``/proc/net/tcp`` every 50 ms (a connection that lives
    less than that may be missed; each one seen is a new connection)."""

    def __init__(self, ports: set[int]) -> None:
        self.ports = ports
        self.seen: set[tuple[int, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TcpSeen:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError), open("/proc/net/tcp") as table:
                for line in table.readlines()[1:]:
                    local, remote, state = line.split()[1:4]
                    peer = int(remote.rsplit(":", 1)[1], 16)
                    if state == "01" and peer in self.ports:  # ESTABLISHED
                        self.seen.add((peer, int(local.rsplit(":", 1)[1], 16)))
            self._stop.wait(0.05)


def space_share(fleet: SpaceFleet, cap: int, service_s: float) -> float:
    """Throughput as a share of ``cap / service_s`` on the Spaces' own clock (the
    intervals of the calls they ran since their last reset)."""
    calls = [iv for space in fleet for iv in space.intervals()]
    if not calls:
        return 0.0
    window = max(end for _, end in calls) - min(start for start, _ in calls)
    return len(calls) * service_s / (cap * window) if window > 0 else 0.0


async def saturation_rows(fleet: SpaceFleet, plan: TransportPlan) -> list[Result]:
    ideal = plan.sat_cap / plan.sat_service_s
    shares: dict[str, list[float]] = {t: [] for t in transports()}
    pool_view: dict[str, list[float]] = {t: [] for t in shares}
    tcp: dict[str, list[int]] = {t: [] for t in shares}
    ports = {int(space.url.rstrip("/").rsplit(":", 1)[1]) for space in fleet}
    errors: dict[str, int] = dict.fromkeys(shares, 0)
    cpu_ms: dict[str, list[tuple[float, float]]] = {t: [] for t in shares}  # client, Spaces
    cpu = CPU(fleet)
    pools = {t: Pool(on_transport(saturation_settings(fleet, plan.sat_cap), t)) for t in shares}
    order = list(pools)
    try:
        for t, p in pools.items():  # open connections, let the windows climb
            for k in range(plan.sat_warmups):
                await pooled_burst(p, 2 * plan.sat_cap, 0.05, f"warm{t}{k}")
        for r in range(plan.sat_rounds):
            for t in order if r % 2 == 0 else order[::-1]:
                for space in fleet:
                    space.reset()
                client0, spaces0 = cpu.read()
                with TcpSeen(ports) as seen:
                    run = await pooled_burst(pools[t], plan.sat_callers, plan.sat_service_s,
                                             f"{t}{r}")  # fmt: skip
                client1, spaces1 = cpu.read()
                tcp[t].append(len(seen.seen))
                shares[t].append(space_share(fleet, plan.sat_cap, plan.sat_service_s))
                pool_view[t].append(plan.sat_callers / run.elapsed / ideal)
                per_call = 1000 / plan.sat_callers
                cpu_ms[t].append(((client1 - client0) * per_call, (spaces1 - spaces0) * per_call))
                errors[t] += len(run.errors)
    finally:
        for p in pools.values():
            await p.aclose()
    results = []
    for t, got in shares.items():
        share = Summary.of(got)
        results.append(
            Result(
                "transport",
                f"transport {t}: saturation, share of G/S",
                "/s",
                Summary.of([s * ideal for s in got]),
                "pool",
                Summary(ideal, ideal, ideal, 1),
                f"G/S = {plan.sat_cap}/{plan.sat_service_s:g} s",
                ratio=share,
                ratio_style="share",
                goal=_goal(t, f"≥ {100 * SATURATION_GOAL:.0f} % of G/S"),
                met=_met(t, errors[t] == 0 and share.median >= SATURATION_GOAL),
                note=(
                    f"{plan.sat_callers} distinct users at once, 3 Spaces, cap G = "
                    f"{plan.sat_cap}, service S = {plan.sat_service_s:g} s, "
                    f"{plan.sat_rounds} round(s); errors {errors[t]}; share on the pool's "
                    f"clock {100 * statistics.median(pool_view[t]):.1f} %; TCP connections "
                    f"to the Spaces seen in a round {statistics.median(tcp[t]):.0f} for "
                    f"{plan.sat_callers} calls; CPU per call: this "
                    f"process {statistics.median(c for c, _ in cpu_ms[t]):.1f} ms, the Spaces "
                    f"{statistics.median(s for _, s in cpu_ms[t]):.1f} ms"
                ),
            )
        )
    return results


# threads and RSS --------------------------------------------------------------------


def rss_rows(fleet: SpaceFleet, plan: TransportPlan) -> list[Result]:
    spaces = fleet.pool_spaces_env()
    held = len(fleet) * plan.rss_per_space

    def child(transport: str | None) -> dict[str, Any]:
        # A pool child reads its settings, the transport too, from the env.
        env = None if transport is None else {**os.environ, "POOL_TRANSPORT": transport}
        mode = "raw" if transport is None else "pool"
        return rss_child(mode, spaces, plan.rss_per_space, settle_s=plan.rss_settle_s, env=env)

    order: list[str | None] = [None, *transports()]
    with ThreadPoolExecutor(len(order) if plan.rss_at_once else 1) as children:
        raw, *runs = children.map(child, order)
    results = []
    for t, run in zip(transports(), runs, strict=True):
        judged = held == HELD  # the goals are stated for 150 connections
        common = (
            f"{run['connections_used']} connections held, every one used once; after "
            f"imports {run['rss0_mb']:.0f} MB, {run['threads0']} threads"
            + ("" if judged else f"; smaller run ({held}): goal not judged")
        )
        results.append(
            Result(
                "transport",
                f"transport {t}: threads, {held} used connections",
                "threads",
                Summary.of([float(run["threads_used"])]),
                "pool",
                Summary.of([float(raw["threads"])]),
                f"{held} raw Clients, 3 used",
                ratio=Summary.of([run["threads_used"] / max(1, raw["threads"])]),
                goal=_goal(t, f"≤ {THREADS_GOAL} threads"),
                met=_met(t, run["threads_used"] <= THREADS_GOAL) if judged else None,
                note=common,
                detail={"pool": run, "raw": raw},
            )
        )
        results.append(
            Result(
                "transport",
                f"transport {t}: RSS, {held} used connections",
                "MB",
                Summary.of([run["rss_used_mb"]]),
                "pool",
                Summary.of([raw["rss_mb"]]),
                f"{held} raw Clients, 3 used",
                ratio=Summary.of([run["rss_used_mb"] / raw["rss_mb"]]),
                goal=_goal(t, f"≤ {RSS_GOAL_MB:.0f} MB"),
                met=_met(t, run["rss_used_mb"] <= RSS_GOAL_MB) if judged else None,
                note=common,
            )
        )
    return results


# first partial ----------------------------------------------------------------------


def _raw_first_lag(client: Any, pace_s: float) -> float:
    """Seconds from the Space's first yield to gradio_client's iterator handing it over."""
    job = client.submit("p", 3, pace_s, api_name="/stream")
    first = None
    for out in job:  # gradio_client's own iteration: it spins on the outputs every 1 ms
        if first is None:
            first = time.time() - float(out["t"])
    job.result()
    assert first is not None, "the stream Space sent no partial"
    return first


async def _pool_first_lag(pool: Pool, pace_s: float) -> float:
    first = None
    async with pool.client(None, space="streamer") as client:
        job = await client.submit("p", 3, pace_s, api_name="/stream")
        async for out in job.stream():
            if first is None:
                first = time.time() - float(out["t"])
    assert first is not None, "the stream Space sent no partial"
    return first


async def partial_rows(streamer: SpaceProcess, plan: TransportPlan) -> list[Result]:
    raw = await asyncio.to_thread(open_raw, streamer.url, shared_ssl=True)
    pools = one_space_pools("streamer", streamer.url)
    names = ["raw", *pools]
    lags: dict[str, list[list[float]]] = {name: [] for name in names}
    pace = random.Random(17)
    try:
        await asyncio.to_thread(_raw_first_lag, raw, 0.01)
        for p in pools.values():
            await _pool_first_lag(p, 0.01)
        for _ in range(plan.partial_rounds):
            for name in names:
                lags[name].append([])
            for k in range(plan.partial_per_round):
                pace_s = 0.05 + pace.uniform(0, 0.05)
                for name in names if k % 2 == 0 else names[::-1]:
                    if name == "raw":
                        lag = await asyncio.to_thread(_raw_first_lag, raw, pace_s)
                    else:
                        lag = await _pool_first_lag(pools[name], pace_s)
                    lags[name][-1].append(1000 * lag)
    finally:
        for p in pools.values():
            await p.aclose()
        await asyncio.to_thread(close_client, raw)
    raw_p50 = [statistics.median(r) for r in lags["raw"]]
    results = []
    for t in pools:
        p50 = [statistics.median(r) for r in lags[t]]
        results.append(
            Result(
                "transport",
                f"transport {t}: first partial, lag behind the Space's yield",
                "ms",
                Summary.of(p50),
                "pool",
                Summary.of(raw_p50),
                "raw Client iterating its job",
                ratio=Summary.of(ratios(p50, raw_p50)),
                goal=_goal(t, f"≤ {PARTIAL_GOAL_MS:g} ms"),
                met=_met(t, statistics.median(p50) <= PARTIAL_GOAL_MS),
                note=(
                    f"{plan.partial_rounds} rounds × {plan.partial_per_round} calls per "
                    "variant, interleaved; per-round p50 of the first partial's lag "
                    "(arrival − the Space's time.time() at its yield)"
                ),
                detail={"lags_ms": {"raw": lags["raw"], t: lags[t]}},
            )
        )
    return results


async def transport_rows(fleet: SpaceFleet, plan: TransportPlan) -> list[Result]:
    """Every figure of the transport row, against ``fleet`` (3 echo Spaces) and a
    ``stream`` Space this starts and stops."""
    streamer = await asyncio.to_thread(SpaceProcess, "streamer", kind="stream")
    try:
        results = await predict_rows(fleet.spaces[0], plan)
        results += await partial_rows(streamer, plan)
    finally:
        await asyncio.to_thread(streamer.stop)
    results += await saturation_rows(fleet, plan)
    results += await asyncio.to_thread(rss_rows, fleet, plan)
    return results
