"""Streaming: time-to-first-partial through the service vs a raw gradio_client job.

    .venv/bin/python scripts/bench_stream.py [--rounds R] [--count N] [--interval S]

One stand-in streaming Space (``devspaces`` kind ``stream``: a real Gradio generator
that yields ``count`` partials ``interval`` seconds apart, each stamped with the
Space's ``time.time()``) and the service (``uvicorn app.main:app``, one worker, the
shipped default SQLite admission store) on 127.0.0.1. Each round runs both variants,
order alternating (ABBA), on the same Space:

* raw — one reused ``gradio_client.Client`` (the pool's shared TLS context):
  ``job = client.submit(...)`` then ``for out in job`` (gradio_client's own iteration,
  its lowest-latency way: it spins on the job's outputs every 1 ms), in a thread;
* service — ``POST /api/predict`` with ``"stream": true`` over one kept-alive httpx
  connection, the SSE events read as they arrive.

Figures per variant (median and min–max over the rounds): time to first partial
(request or submit → first partial in the caller's hands), the lag of every partial
behind the Space's yield (arrival − the Space's timestamp; one clock), and the gap
between partials. Then the difference service − raw, per round (both variants of a
round use the same pace), its median (goal: within 20 ms). The machine's load average
is printed with the figures.

Phase: gradio_client picks a job's messages up in a loop that sleeps 50 ms, started
when the job is sent; with yields at a fixed multiple of 50 ms after the job starts,
every call of a variant sees the same phase, and a variant can land at ~2 ms or
~48 ms of lag by the luck of its join time. So each round draws its pace from
``interval`` + U(0, 50 ms): the phase is spread alike for both variants.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "scripts"), ROOT]
for _key, _value in (
    ("GRADIO_ANALYTICS_ENABLED", "False"),
    ("HF_HUB_DISABLE_TELEMETRY", "1"),
    ("HF_HUB_OFFLINE", "1"),
):
    os.environ.setdefault(_key, _value)

import httpx  # noqa: E402
from _bench_clients import open_raw  # noqa: E402
from _bench_stats import Summary, fmt_summary  # noqa: E402

from devspaces import SpaceProcess, free_port  # noqa: E402
from pool.transport._fallback import close_client  # noqa: E402

Sample = dict[str, Any]  # ttfp_ms, lags_ms, gaps_ms


def start_service(space: SpaceProcess, directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    """uvicorn app.main:app on a free loopback port over ``space``; returns (proc, url)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("POOL_")}
    env.update(
        POOL_SPACES=f"streamer={space.url}",
        POOL_COORDINATOR_URL=f"sqlite:///{directory / 'coordinator.db'}",
        POOL_MIN_CONNECTIONS="1",
        PYTHONPATH=ROOT,
        NO_PROXY="*",
    )
    log = (directory / "service.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning"],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError((directory / "service.log").read_text()[-2000:])
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the service did not start")
        time.sleep(0.05)


def summarize(arrivals: list[tuple[float, float]], stamps: list[float], started: float) -> Sample:
    """Figures of one call from perf_counter arrivals and the Space's time.time() stamps."""
    return {
        "ttfp_ms": 1000 * (arrivals[0][0] - started) if arrivals else float("nan"),
        "lags_ms": [
            1000 * (wall - stamp) for (_, wall), stamp in zip(arrivals, stamps, strict=True)
        ],
        "gaps_ms": [1000 * (b[0] - a[0]) for a, b in itertools.pairwise(arrivals)],
    }


def raw_call(client: Any, count: int, interval: float) -> Sample:
    started = time.perf_counter()
    job = client.submit("b", count, interval, api_name="/stream")
    arrivals: list[tuple[float, float]] = []
    stamps: list[float] = []
    for out in job:
        arrivals.append((time.perf_counter(), time.time()))
        stamps.append(out["t"])
    job.result()
    return summarize(arrivals, stamps, started)


def service_call(http: httpx.Client, count: int, interval: float) -> Sample:
    body = {"api_name": "/stream", "args": ["b", count, interval], "stream": True}
    started = time.perf_counter()
    arrivals: list[tuple[float, float]] = []
    stamps: list[float] = []
    with http.stream("POST", "/api/predict", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = json.loads(line[6:])
            if "partial" in data:
                arrivals.append((time.perf_counter(), time.time()))
                stamps.append(data["partial"]["t"])
            elif data.get("stage") in ("done", "failed"):
                break
    return summarize(arrivals, stamps, started)


def load_sampler(samples: list[float], stop: threading.Event) -> None:
    while not stop.wait(1.0):
        samples.append(os.getloadavg()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="calls per variant")
    parser.add_argument("--count", type=int, default=5, help="partials per call")
    parser.add_argument(
        "--interval", type=float, default=0.1, help="seconds between yields (+ U(0, 0.05))"
    )
    args = parser.parse_args()
    loads: list[float] = [os.getloadavg()[0]]
    stop = threading.Event()
    threading.Thread(target=load_sampler, args=(loads, stop), daemon=True).start()
    results: dict[str, list[Sample]] = {"raw": [], "service": []}
    with tempfile.TemporaryDirectory() as tmp, SpaceProcess(
        "streamer", kind="stream", startup_timeout_s=180
    ) as space:
        proc, url = start_service(space, Path(tmp))
        client = open_raw(space.url, shared_ssl=True)
        try:
            with httpx.Client(base_url=url, timeout=60) as http:
                for _ in range(3):  # warm both: connections, threads, imports
                    raw_call(client, 2, 0.0)
                    service_call(http, 2, 0.0)
                for r in range(args.rounds):
                    pace = args.interval + random.uniform(0.0, 0.05)
                    order = ("raw", "service") if r % 2 == 0 else ("service", "raw")
                    for variant in order:
                        if variant == "raw":
                            results[variant].append(raw_call(client, args.count, pace))
                        else:
                            results[variant].append(service_call(http, args.count, pace))
        finally:
            close_client(client)
            proc.terminate()
            proc.wait(timeout=15)
    stop.set()
    load = Summary.of(loads)
    print(
        f"{args.rounds} calls per variant, {args.count} partials {args.interval * 1000:.0f} ms"
        f" apart; load average (1 min) {load.median:.1f} ({load.low:.1f}–{load.high:.1f})"
    )
    medians: dict[str, dict[str, float]] = {}
    for variant, samples in results.items():
        ttfp = [s["ttfp_ms"] for s in samples]
        lags = [lag for s in samples for lag in s["lags_ms"]]
        gaps = [gap for s in samples for gap in s["gaps_ms"]]
        medians[variant] = {
            "ttfp": statistics.median(ttfp),
            "lag": statistics.median(lags),
            "gap": statistics.median(gaps),
        }
        print(
            f"{variant:8s} time to first partial {fmt_summary(Summary.of(ttfp), 'ms')}; "
            f"lag behind the Space's yield {fmt_summary(Summary.of(lags), 'ms')}; "
            f"gap between partials {fmt_summary(Summary.of(gaps), 'ms')}"
        )
    paired = [
        s["ttfp_ms"] - r["ttfp_ms"]
        for s, r in zip(results["service"], results["raw"], strict=True)
    ]
    diff = statistics.median(paired)
    lag_diff = medians["service"]["lag"] - medians["raw"]["lag"]
    verdict = "met" if diff <= 20 else "MISSED"
    print(
        f"service − raw, per round: time to first partial {diff:+.1f} ms median "
        f"({min(paired):+.1f} – {max(paired):+.1f}) (goal ≤ +20 ms: {verdict}); "
        f"difference of the medians {medians['service']['ttfp'] - medians['raw']['ttfp']:+.1f}"
        f" ms; lag per partial {lag_diff:+.1f} ms"
    )


if __name__ == "__main__":
    main()
