"""Soak: the service under mixed load past every retention window; is its memory bounded?

    .venv/bin/python scripts/soak.py --seconds 480 --sample-s 60       # BENCHMARKS.md run
    .venv/bin/python scripts/soak.py --seconds 40 --sample-s 2 --json  # tests/service/test_soak.py
    SOAK_TRACE=1 .venv/bin/python scripts/soak.py ...    # + tracemalloc/gc growth in the service

Starts three stand-in Spaces (alpha: echo, chat: a streamed chat, pic: files) unless
``--spaces`` names running ones (``alpha=URL,chat=URL,pic=URL``), then the service
(``uvicorn app.main:app`` through ``scripts/_soak_service.py``, SQLite coordinator) with
every retention window short: finished jobs and Idempotency-Keys 5 s, output files 5 s,
user pins 5 s, idle connections 2 s, Gradio sessions 5 s. Clients loop over a mix:
predicts (many distinct users), jobs (with an Idempotency-Key, followed over SSE to the
end), file uploads and the output file fetched, streamed chat replies (SSE), errors
(unknown endpoint 422, a raising endpoint, a bad body) and bursts past the global cap
(503 busy); a transport error (a dropped connection) counts as status 0. Every
``--sample-s`` it prints the service's RSS, threads and open fds; at the end the RSS
slope (least squares, MiB/min) over the samples after ``--warmup-s`` and the spread of
threads and fds there. ``--json`` prints the summary as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devspaces import SpaceFleet, free_port  # noqa: E402

SHORT_WINDOWS = {
    "POOL_JOB_RETENTION_S": "5",
    "POOL_FILE_TTL_S": "5",
    "POOL_ASSIGNMENT_TTL_S": "5",
    "POOL_IDLE_TIMEOUT_S": "2",
    "POOL_WARM_WINDOW_S": "2",
    "POOL_GRADIO_SESSION_IDLE_S": "5",
    "POOL_HEALTH_INTERVAL_S": "5",
    "POOL_GLOBAL_MAX_CONCURRENT": "6",
    "POOL_CONSUMER_MAX_CONCURRENT": "2",
    "POOL_QUEUE_TIMEOUT_S": "0.5",
    "POOL_JOB_QUEUE_TIMEOUT_S": "2",
    "POOL_MIN_CONNECTIONS": "1",
    "POOL_MAX_CONNECTIONS": "8",
}
MIB = 1024 * 1024


@contextlib.contextmanager
def spaces(given: str | None) -> Iterator[str]:
    """POOL_SPACES: ``given``, or three demo-like stand-ins started here."""
    if given:
        yield given
        return
    with SpaceFleet(names=["alpha", "chat", "pic"], kind=["echo", "chat", "image"]) as fleet:
        yield fleet.pool_spaces_env()


@contextlib.contextmanager
def service(pool_spaces: str, directory: Path, trace: bool) -> Iterator[tuple[str, int]]:
    """The service over ``pool_spaces`` with short windows: (its URL, its pid)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("POOL_")}
    env.update(SHORT_WINDOWS)
    env.update(
        POOL_SPACES=pool_spaces,
        POOL_COORDINATOR_URL=f"sqlite:///{directory / 'coordinator.db'}",
        POOL_FILE_DIR=str(directory / "files"),
        POOL_ADMIN_TOKEN="soak-admin",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        NO_PROXY="*",
        SOAK_TRACE="1" if trace else "",
        SOAK_TRACE_FILE=str(directory / "trace.txt"),
    )
    log = (directory / "service.log").open("wb")
    command = [sys.executable, str(ROOT / "scripts" / "_soak_service.py"), str(port)]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((directory / "service.log").read_text()[-3000:])
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def sample(pid: int) -> dict[str, float]:
    """RSS (MiB), threads and open fds of the service process."""
    process = psutil.Process(pid)
    return {
        "rss_mib": process.memory_info().rss / MIB,
        "threads": process.num_threads(),
        "fds": process.num_fds(),
    }


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return 60.0 * cov / var if var else 0.0


async def sse_to_end(http: httpx.AsyncClient, method: str, url: str, **kw: Any) -> int:
    """Read an SSE answer to its end; its status."""
    async with http.stream(method, url, **kw) as response:
        async for _ in response.aiter_lines():
            pass
        return response.status_code


async def one_round(http: httpx.AsyncClient, i: int, image: bytes) -> list[int]:
    """One pass over the mix; the statuses it got."""
    user = f"soak{i % 500}@example.com"  # distinct users: pins expire after 5 s
    statuses = []
    answer = await http.post(
        "/api/predict", json={"api_name": "/echo", "args": [f"p{i}", 0.05], "email": user}
    )
    statuses.append(answer.status_code)
    created = await http.post(
        "/api/jobs",
        json={"api_name": "/echo", "args": [f"j{i}", 0.1], "email": user},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    statuses.append(created.status_code)
    if created.status_code < 300:
        job = created.json()["job_id"]
        statuses.append(await sse_to_end(http, "GET", f"/api/jobs/{job}/events"))
    made = await http.post(
        "/api/predict",
        data={"body": json.dumps({"api_name": "/flip", "args": [{"file": {"upload": "image"}}]})},
        files={"image": ("cat.png", image, "image/png")},
    )
    statuses.append(made.status_code)
    if made.status_code == 200:
        statuses.append((await http.get(made.json()["result"]["file"]["url"])).status_code)
    body = {"api_name": "/chat", "args": [f"hi {i}"], "stream": True}
    statuses.append(await sse_to_end(http, "POST", "/api/predict", json=body))
    for bad in ({"api_name": "/nope"}, {"api_name": "/fail", "args": ["x"]}, {"args": 3}):
        statuses.append((await http.post("/api/predict", json=bad)).status_code)
    return statuses


async def burst(http: httpx.AsyncClient) -> list[int]:
    """More slow predicts than the global cap admits within the queue timeout: 503s."""
    body = {"api_name": "/echo", "args": ["slow", 1.0]}
    answers = await asyncio.gather(*(http.post("/api/predict", json=body) for _ in range(10)))
    return [a.status_code for a in answers]


async def load(url: str, until: float, clients: int, statuses: Counter[int]) -> None:
    """``clients`` loops of the mix plus a burst loop, until the monotonic time ``until``."""
    image = (ROOT / "examples" / "cat.png").read_bytes()
    counter = itertools.count()

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            while time.monotonic() < until:
                try:
                    statuses.update(await one_round(http, next(counter), image))
                except httpx.TransportError:  # counted as status 0, reported
                    statuses[0] += 1

    async def bursts() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            while time.monotonic() < until:
                try:
                    statuses.update(await burst(http))
                except httpx.TransportError:
                    statuses[0] += 1
                await asyncio.sleep(2.0)

    await asyncio.gather(*(client() for _ in range(clients)), bursts())


async def soak(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    statuses: Counter[int] = Counter()
    samples: list[dict[str, float]] = []
    worker = asyncio.get_running_loop().create_task(
        load(url, started + args.seconds, args.clients, statuses)
    )
    while not worker.done():
        await asyncio.wait({worker}, timeout=args.sample_s)
        point = {"t": round(time.monotonic() - started, 1), **sample(pid)}
        point["requests"] = sum(statuses.values())
        samples.append(point)
        if not args.json:
            print(
                f"t={point['t']:6.0f}s rss={point['rss_mib']:7.1f} MiB "
                f"threads={point['threads']:3.0f} fds={point['fds']:4.0f} "
                f"requests={point['requests']}",
                flush=True,
            )
    worker.result()
    return summary(samples, statuses, args.warmup_s)


def summary(
    samples: list[dict[str, float]], statuses: Counter[int], warmup_s: float
) -> dict[str, Any]:
    after = [s for s in samples if s["t"] >= warmup_s]

    def spread(key: str) -> list[float]:
        return [round(min(s[key] for s in after), 1), round(max(s[key] for s in after), 1)]

    return {
        "samples": samples,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "warmup_s": warmup_s,
        "rss_slope_mib_per_min": round(slope_per_min([(s["t"], s["rss_mib"]) for s in after]), 3),
        "rss_after_warmup_mib": spread("rss_mib"),
        "threads_after_warmup": spread("threads"),
        "fds_after_warmup": spread("fds"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=480)
    parser.add_argument("--sample-s", type=float, default=60)
    parser.add_argument("--warmup-s", type=float, default=None, help="default: a quarter")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--spaces", default=None, help="POOL_SPACES of running stand-ins")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.warmup_s is None:
        args.warmup_s = args.seconds / 4
    trace = bool(os.environ.get("SOAK_TRACE"))
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp, spaces(args.spaces) as fleet:
        with service(fleet, Path(tmp), trace) as (url, pid):
            result = asyncio.run(soak(url, pid, args))
        if trace:
            print((Path(tmp) / "trace.txt").read_text())
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
