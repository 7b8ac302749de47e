"""Real processes sharing one store: the global cap holds, crashed holders are reclaimed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool.admission import CONSUMER_PREFIX, GLOBAL_RESOURCE

from . import _worker
from .conftest import Opener
from .helpers import until_async

ROOT = Path(__file__).resolve().parents[2]


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.admission._worker", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def expect_line(proc: subprocess.Popen[str], word: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == word, f"worker said {line!r}, expected {word!r}"


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[str]]]:
    """Worker processes started by the test, killed if still running at the end."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def peak_holders(intervals: list[tuple[list[str], int, int]]) -> dict[str, int]:
    """Most simultaneous holders per resource (a release sorts before an acquire)."""
    events: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for resources, start, end in intervals:
        for resource in resources:
            events[resource].extend([(start, 1), (end, -1)])
    peaks: dict[str, int] = {}
    for resource, points in events.items():
        level = peak = 0
        for _, step in sorted(points, key=lambda p: (p[0], p[1])):
            level += step
            peak = max(peak, level)
        peaks[resource] = peak
    return peaks


async def test_four_processes_never_exceed_the_global_cap(
    shared_url: str, open_store: Opener, workers: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    """Four processes hammering one store never hold more slots than any limit."""
    limits = {GLOBAL_RESOURCE: 5, "space:a": 3, "space:b": 3, CONSUMER_PREFIX: 1}
    await open_store(shared_url).set_limits(limits)
    outs = [tmp_path / f"intervals-{n}.json" for n in range(4)]
    workers.extend(spawn("hammer", shared_url, str(out)) for out in outs)
    for proc in workers:
        await asyncio.to_thread(expect_line, proc, "ready")
    for proc in workers:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in workers:
        assert await asyncio.to_thread(proc.wait, 30) == 0
    intervals = [i for out in outs for i in json.loads(out.read_text())]
    peaks = peak_holders(intervals)
    assert len(intervals) > 100, "the workers hardly ran"
    assert peaks[GLOBAL_RESOURCE] <= 5
    assert peaks[GLOBAL_RESOURCE] >= 3, "no contention: the test proves nothing"
    assert peaks["space:a"] <= 3 and peaks["space:b"] <= 3
    assert all(n <= 1 for r, n in peaks.items() if r.startswith(CONSUMER_PREFIX))


async def test_killed_process_slots_and_queue_entries_are_reclaimed(
    shared_url: str, open_store: Opener, workers: list[subprocess.Popen[str]]
) -> None:
    """SIGKILL a holder: its slots return within lease_ttl + 1 s and its waiter is gone."""
    survivor = open_store(shared_url, lease_ttl_s=_worker.LEASE_TTL_S)
    await survivor.set_limits({GLOBAL_RESOURCE: 3, "space:blocked": 0})
    proc = spawn("hold", shared_url, "3")
    workers.append(proc)
    await asyncio.to_thread(expect_line, proc, "holding")
    snap = await survivor.snapshot()
    assert (snap.held, snap.waiting) == ({GLOBAL_RESOURCE: 3}, 1)
    waiter = asyncio.ensure_future(survivor.acquire([GLOBAL_RESOURCE], timeout=10))
    killed_at = time.monotonic()
    os.kill(proc.pid, signal.SIGKILL)
    lease = await waiter
    assert time.monotonic() - killed_at <= _worker.LEASE_TTL_S + 1.0

    async def entries_gone() -> bool:
        snap = await survivor.snapshot()
        return snap.waiting == 0 and snap.held == {GLOBAL_RESOURCE: 1}

    await until_async(entries_gone, timeout=_worker.LEASE_TTL_S + 1.0, what="reclaim")
    others = [await survivor.acquire([GLOBAL_RESOURCE], timeout=1) for _ in range(2)]
    for held in [lease, *others]:
        await survivor.release(held)
