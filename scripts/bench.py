"""spacepool benchmark (issue 6): every figure side by side, as a ratio, in one run.

    scripts/bench [--quick] [--only ROW[,ROW...]] [--json PATH] [--profile DIR]

Rows (``--only`` names): ``fresh`` (pooled predict vs a new Client per call),
``raw`` (pool overhead vs one raw Client), ``cycle`` (admission cycle vs
anyio.CapacityLimiter and SQLAlchemy QueuePool), ``fairness`` (asyncpg #1247's
harness), ``queue`` (a store's hand-off with 500 waiters queued vs 10), ``stores``
(SQLite / Redis via scripts/bench_admission.py), ``saturation``
(many callers, 3 Spaces, a global cap), ``rss`` (a process holding 150 connections),
``transport`` (the pool on each transport vs a raw Client: 0 s predict, saturation,
threads and RSS at 150 used connections, first-partial lag; also
``scripts/bench_transport.py``), ``replicas`` and ``replicas-mixed`` (replicas used to
their real capacity, issue 31), ``limit`` (saturation and latency against an oracle on
the native transport without the pool; scripts/_bench_replicas.py), ``scale-memory``,
``scale-sqlite``, ``scale-redis`` (admission with 10,000 waiters over 1,000 Spaces
against 1 waiter on 1 Space, per store, issue 39; scripts/_bench_scale.py),
``scale-redis-fleet`` (4 processes' acquire+release with 10,000 waiters parked over
1,000 Spaces vs an empty Redis store; scripts/_bench_fleet.py).

Everything runs against real Gradio apps on 127.0.0.1 (``devspaces``), the compared
variants interleaved in repetitions; each figure is a median with its min–max over
the repetitions. ``--quick`` (CI smoke, every row, < 4 min) shrinks repetitions and sizes; the
full run (< 10 min) is the one BENCHMARKS.md quotes. The machine is shared: the 1-minute
load average is sampled every second while each row runs and printed next to its
figures (median, min–max). The exit code is 1 only when a row failed to run; a missed
goal is a finding, printed in the table.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_VENV_PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
if (
    os.path.exists(_VENV_PYTHON)
    and os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ROOT, ".venv"))
    and not os.environ.get("SPACEPOOL_BENCH_NO_REEXEC")
):
    os.environ["SPACEPOOL_BENCH_NO_REEXEC"] = "1"
    # sys.argv[0]: the script that was run (bench.py, or one that imports it).
    os.execv(_VENV_PYTHON, [_VENV_PYTHON, os.path.abspath(sys.argv[0]), *sys.argv[1:]])

sys.path[:0] = [os.path.join(ROOT, "scripts"), ROOT]
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p
)  # worker processes (bench_admission, the RSS child) import pool too
for _key, _value in (
    ("GRADIO_ANALYTICS_ENABLED", "False"),
    ("HF_HUB_DISABLE_TELEMETRY", "1"),
    ("HF_HUB_OFFLINE", "1"),
):
    os.environ.setdefault(_key, _value)

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from importlib import metadata  # noqa: E402
from typing import Any  # noqa: E402

from _bench_stats import Result, Summary, markdown_table, not_measured  # noqa: E402

from devspaces import SpaceFleet  # noqa: E402

ROWS = (
    "cycle", "fairness", "queue", "stores", "fresh", "raw", "saturation", "rss", "transport",
    "replicas", "replicas-mixed", "limit", "scale-memory", "scale-sqlite", "scale-redis",
    "scale-redis-fleet",
)  # fmt: skip
NEEDS_SPACES = frozenset({"fresh", "raw", "saturation", "rss", "transport", "limit"})


@dataclass(frozen=True)
class Plan:
    """Repetitions and sizes of one mode."""

    fresh_rounds: int
    fresh_per_round: int
    raw_rounds: int
    raw_per_round: int
    cycle_rounds: int
    cycle_count: int
    fair_once_rounds: int
    fair_loop_rounds: int
    fair_loop_s: float
    queue_rounds: int
    queue_steps: int
    store_rounds: int
    store_seconds: float
    sat_callers: int
    sat_cap: int
    sat_service_s: float
    sat_rounds: int
    sat_raw_calls: int
    rss_per_space: int
    rss_rounds: int
    rss_with_raw: bool
    transport: str  # a plan of _bench_transport.PLANS
    rep_rounds: int  # replicas, replicas-mixed, limit (scripts/_bench_replicas.py)
    rep_service_s: float
    mix_seconds: float
    lim_rounds: int
    lim_seconds: float
    lim_latency_calls: int


FULL = Plan(
    fresh_rounds=4, fresh_per_round=5, raw_rounds=5, raw_per_round=10,
    cycle_rounds=15, cycle_count=10_000,
    fair_once_rounds=3, fair_loop_rounds=2, fair_loop_s=5.0,
    queue_rounds=4, queue_steps=200,
    store_rounds=5, store_seconds=1.5,
    sat_callers=500, sat_cap=12, sat_service_s=0.5, sat_rounds=2, sat_raw_calls=4,
    rss_per_space=50, rss_rounds=1, rss_with_raw=True,
    transport="full",
    rep_rounds=3, rep_service_s=1.5, mix_seconds=10.0,
    lim_rounds=3, lim_seconds=6.0, lim_latency_calls=60,
)  # fmt: skip
QUICK = Plan(
    fresh_rounds=2, fresh_per_round=2, raw_rounds=2, raw_per_round=4,
    cycle_rounds=5, cycle_count=2_000,
    fair_once_rounds=1, fair_loop_rounds=0, fair_loop_s=0.0,
    queue_rounds=1, queue_steps=30,
    store_rounds=1, store_seconds=0.3,
    sat_callers=36, sat_cap=12, sat_service_s=0.5, sat_rounds=1, sat_raw_calls=1,
    rss_per_space=8, rss_rounds=1, rss_with_raw=False,
    transport="smoke",  # the CI smoke: every transport figure, tiny sizes
    rep_rounds=1, rep_service_s=0.5, mix_seconds=3.0,
    lim_rounds=1, lim_seconds=2.0, lim_latency_calls=10,
)  # fmt: skip


def machine() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    mem_gb = 0.0
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as fh:
        mem_gb = int(fh.readline().split()[1]) / 1024 / 1024

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "absent"

    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory_gb": round(mem_gb, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_start": os.getloadavg(),
        "versions": {
            d: version(d) for d in ("gradio", "gradio_client", "anyio", "sqlalchemy", "redis")
        },
    }


class Runner:
    """Runs the selected rows in order; starts the stand-in Spaces only when needed."""

    def __init__(self, plan: Plan, only: list[str], profile_dir: str | None) -> None:
        self.plan = plan
        self.only = only
        self.profile_dir = profile_dir
        self.results: list[Result] = []
        self.failed: list[str] = []
        self.timings: dict[str, float] = {}
        self.loads: dict[str, list[float]] = {}
        self.fleet: Any = None

    def run(self) -> None:
        with contextlib.ExitStack() as stack:
            stack.callback(self._stop_fleet)
            fleet_error: str | None = None
            for key in self.only:
                if key in NEEDS_SPACES and self.fleet is None and fleet_error is None:
                    _progress("starting 3 stand-in Spaces (alpha, beta, gamma)")
                    try:
                        booting = time.monotonic()
                        self.fleet = SpaceFleet(3, startup_timeout_s=180)
                        self.timings["spaces_start"] = time.monotonic() - booting
                    except Exception as exc:
                        traceback.print_exc()
                        fleet_error = f"stand-in Spaces did not start: {exc!r}"[:300]
                if key in NEEDS_SPACES and fleet_error is not None:
                    self.failed.append(key)
                    self.results.append(not_measured(key, key, "", fleet_error))
                    continue
                _progress(f"row {key} ...")
                started = time.monotonic()
                first = len(self.results)
                try:
                    with self._profiled(key), _load_sampled(self.loads.setdefault(key, [])):
                        self.results += self.measure(key)
                except Exception as exc:
                    traceback.print_exc()
                    self.failed.append(key)
                    self.results.append(not_measured(key, key, "", f"failed: {exc!r}"[:300]))
                self.timings[key] = time.monotonic() - started
                for result in self.results[first:]:
                    result.load = Summary.of(self.loads[key])
                _progress(f"row {key} done in {self.timings[key]:.0f} s")

    def _stop_fleet(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()

    def measure(self, key: str) -> list[Result]:
        p = self.plan
        if key == "cycle":
            from _bench_cycle import cycle_rows

            return asyncio.run(cycle_rows(rounds=p.cycle_rounds, cycles=p.cycle_count))
        if key == "fairness":
            from _bench_cycle import fairness_rows

            return asyncio.run(
                fairness_rows(
                    once_rounds=p.fair_once_rounds,
                    loop_rounds=p.fair_loop_rounds,
                    loop_s=p.fair_loop_s,
                )
            )
        if key == "queue":
            from _bench_queue import queue_rows

            return asyncio.run(queue_rows(rounds=p.queue_rounds, steps=p.queue_steps))
        if key.startswith("scale-") and key != "scale-redis-fleet":
            from _bench_scale import scale_rows

            kind = key.removeprefix("scale-")
            return asyncio.run(scale_rows(kind, quick=self.plan is QUICK))
        if key == "stores":
            from _bench_stores import store_rows

            return asyncio.run(store_rows(rounds=p.store_rounds, seconds=p.store_seconds))
        if key == "fresh":
            from _bench_clients import fresh_rows

            return asyncio.run(
                fresh_rows(self.fleet["alpha"], rounds=p.fresh_rounds, per_round=p.fresh_per_round)
            )
        if key == "raw":
            from _bench_clients import raw_rows

            return asyncio.run(
                raw_rows(self.fleet["alpha"], rounds=p.raw_rounds, per_round=p.raw_per_round)
            )
        if key == "saturation":
            from _bench_saturation import saturation_rows

            return asyncio.run(
                saturation_rows(
                    self.fleet,
                    callers=p.sat_callers,
                    cap=p.sat_cap,
                    service_s=p.sat_service_s,
                    rounds=p.sat_rounds,
                    raw_calls=p.sat_raw_calls,
                )
            )
        if key == "rss":
            from _bench_rss import rss_rows

            return rss_rows(
                self.fleet.pool_spaces_env(),
                per_space=p.rss_per_space,
                rounds=p.rss_rounds,
                with_raw=p.rss_with_raw,
            )
        if key == "transport":
            from _bench_transport import PLANS, transport_rows

            return asyncio.run(transport_rows(self.fleet, PLANS[p.transport]))
        if key == "replicas":
            from _bench_replicas import replicas_rows

            return asyncio.run(replicas_rows(rounds=p.rep_rounds, service_s=p.rep_service_s))
        if key == "replicas-mixed":
            from _bench_replicas import mixed_rows

            return asyncio.run(
                mixed_rows(rounds=p.rep_rounds, service_s=p.rep_service_s / 1.5,
                           seconds=p.mix_seconds)
            )
        if key == "limit":
            from _bench_replicas import limit_rows

            return asyncio.run(
                limit_rows(
                    list(self.fleet), rounds=p.lim_rounds, g=p.sat_cap,
                    service_s=p.sat_service_s, seconds=p.lim_seconds,
                    latency_calls=p.lim_latency_calls,
                )
            )
        if key == "scale-redis-fleet":
            from _bench_fleet import fleet_rows

            return asyncio.run(fleet_rows(quick=p != FULL))
        raise ValueError(key)

    @contextlib.contextmanager
    def _profiled(self, key: str) -> Iterator[None]:
        if self.profile_dir is None:
            yield
            return
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        profiler.start()
        try:
            yield
        finally:
            profiler.stop()
            os.makedirs(self.profile_dir, exist_ok=True)
            path = os.path.join(self.profile_dir, f"{key}.txt")
            with open(path, "w") as fh:
                fh.write(profiler.output_text(unicode=True, color=False, show_all=False))
            _progress(f"profile of {key} written to {path}")


@contextlib.contextmanager
def _load_sampled(samples: list[float], every_s: float = 1.0) -> Iterator[None]:
    """Sample the 1-minute load average into ``samples`` while the block runs."""
    done = threading.Event()

    def sample() -> None:
        while True:
            samples.append(os.getloadavg()[0])
            if done.wait(every_s):
                return

    thread = threading.Thread(target=sample, name="bench-load", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        samples.append(os.getloadavg()[0])


def _progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def report(results: list[Result], info: dict[str, Any], mode: str, elapsed: float) -> str:
    lines = [
        f"spacepool bench, {mode} mode, {elapsed:.0f} s; {info['cpus']} CPUs ({info['cpu']}), "
        f"Python {info['python']}, gradio {info['versions']['gradio']}, gradio_client "
        f"{info['versions']['gradio_client']}; load average at start "
        f"{' '.join(f'{x:.1f}' for x in info['load_avg_start'])}, at end "
        f"{' '.join(f'{x:.1f}' for x in info['load_avg_end'])}",
        "",
        markdown_table(results),
        "",
        "Notes:",
    ]
    lines += [f"- {r.row}: {r.note}" for r in results if r.note]
    return "\n".join(lines)


def main(argv: list[str] | None = None, *, quick_plan: Plan = QUICK) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bench", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke: every row, short (< 4 min)")
    parser.add_argument(
        "--only", default=",".join(ROWS), help=f"comma-separated rows: {','.join(ROWS)}"
    )
    parser.add_argument("--json", metavar="PATH", help="also write every figure and sample here")
    parser.add_argument(
        "--profile", metavar="DIR", help="pyinstrument each row (slows it) into DIR/<row>.txt"
    )
    args = parser.parse_args(argv)
    only = [key.strip() for key in args.only.split(",") if key.strip()]
    unknown = sorted(set(only) - set(ROWS))
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {','.join(ROWS)}")
    only = [key for key in ROWS if key in only]  # the fixed order: quiet rows first
    mode = "quick" if args.quick else "full"
    info = machine()
    started = time.monotonic()
    runner = Runner(quick_plan if args.quick else FULL, only, args.profile)
    runner.run()
    elapsed = time.monotonic() - started
    info["load_avg_end"] = os.getloadavg()
    print(report(runner.results, info, mode, elapsed), flush=True)
    if args.json:
        payload = {
            "command": "scripts/bench " + shlex.join(sys.argv[1:]),
            "mode": mode,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "elapsed_s": elapsed,
            "row_seconds": runner.timings,
            "row_load_avg_1min": runner.loads,
            "machine": info,
            "failed_rows": runner.failed,
            "results": [r.as_json() for r in runner.results],
        }
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=1, default=str)
    return 1 if runner.failed else 0


if __name__ == "__main__":
    sys.exit(main())
