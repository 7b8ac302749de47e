"""The fleet under network partitions: two hosts, a Redis and a Space, each in its own
network namespace, packets dropped (not refused) between chosen pairs (``_netlab``).

Scaled down to stay inside the suite's time budget: lease TTL 2 s instead of 15 s,
and every cut a multiple of the TTL, so that each crosses the thresholds the issue's
cuts crossed (longer than the TTL: the store expires the cut-off leases and the other
host is admitted; the long cut: several TTLs, the callers' deadline long past):

==========================  ================  ==============
partition                   issue (TTL 15 s)  here (2 × TTL)
==========================  ================  ==============
Redis cut from both hosts   20 s              4 s (2 TTL)
host 1 cut from Redis only  (any)             4 s (2 TTL)
host 1 cut from everything  12 s              4 s (2 TTL)
host 1 cut from everything  60 s / 130 s      8 s (4 TTL)
==========================  ================  ==============

``SPACEPOOL_PARTITION_TTL_S=15 pytest -s tests/chaos/test_partitions.py`` is the
full-size run (cuts of 30, 30, 30 and 60 s; about 4 minutes); it prints the figures
of ``docs/leases.md``. Concurrency is measured at the Space, on its own clock (one
machine, one clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from devspaces import SpaceProcess

from ._netlab import NetLab, unavailable
from .conftest import ROOT, pool_env

# SPACEPOOL_PARTITION_TTL_S=15 runs the full-size version (cuts scale with the TTL).
TTL_S = float(os.environ.get("SPACEPOOL_PARTITION_TTL_S", "2"))
CUT_STORE_S = 2 * TTL_S  # the 20 s
CUT_HOST_S = 2 * TTL_S  # host 1 from Redis only
CUT_SHORT_S = 2 * TTL_S  # the 12 s
CUT_LONG_S = 4 * TTL_S  # the 60 s
DEADLINE_S = 2.5 * TTL_S  # the callers' deadline (timeout=) in the cuts of host 1
CAP = 2
PREFIX = "part:"
GHOST_AGE_S = 0.8 * TTL_S + 0.2  # a held lease is renewed or fenced by 0.8 TTL
# A call admitted just before a cut may still start at the Space until its lease's
# local expiry (0.8 TTL after its last renewal), and a little after on a loaded box.
GRANTED_BEFORE_S = 0.8 * TTL_S + 0.2
KINDS = {"ok", "busy", "lease_lost", "deadline"}  # never a 500 (upstream, unexpected)


class LabSpace(SpaceProcess):
    """A stand-in Space in the lab's ``space`` namespace, on its address there."""

    def __init__(self, lab: NetLab) -> None:
        self.lab = lab
        super().__init__("alpha", port=7860, startup_timeout_s=90.0, wait=False)

    @property
    def url(self) -> str:
        return f"http://{self.lab.ip['space']}:{self.port}/"

    def command(self) -> list[str]:
        return [*self.lab.exec("space"), *super().command(), "--host", self.lab.ip["space"]]


@dataclass
class Host:
    """One service host: its process, its answers (JSON lines), its load."""

    name: str
    proc: subprocess.Popen[str]
    answers: list[dict[str, Any]] = field(default_factory=list)

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.answers.append(json.loads(line))

    def load(self, callers: int, delay: float = 0.3, timeout: float = 4.0) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"callers": callers, "delay": delay,
                                          "timeout": timeout}) + "\n")  # fmt: skip
        self.proc.stdin.flush()


@dataclass
class Lab:
    net: NetLab
    space: LabSpace
    store: redis.Redis
    h1: Host
    h2: Host

    def leases(self) -> int:
        return int(self.store.hlen(PREFIX + "leases"))


async def until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _start_redis(net: NetLab) -> subprocess.Popen[bytes]:
    server = shutil.which("redis-server")
    assert server, "redis-server is not installed"
    return subprocess.Popen(
        [*net.exec("redis"), server, "--bind", net.ip["redis"], "--port", "6379",
         "--save", "", "--appendonly", "no", "--protected-mode", "no"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip


def _start_host(net: NetLab, name: str, space: LabSpace) -> Host:
    env = pool_env(
        f"alpha={space.url}",
        POOL_COORDINATOR_URL=f"redis://{net.ip['redis']}:6379/0?prefix={PREFIX}&timeout_ms=500",
        POOL_GLOBAL_MAX_CONCURRENT=str(CAP), POOL_CONSUMER_MAX_CONCURRENT="8",
        POOL_LEASE_TTL_S=str(TTL_S), POOL_QUEUE_TIMEOUT_S="3", POOL_CONNECT_TIMEOUT_S="2",
    )  # fmt: skip
    proc = subprocess.Popen(
        [*net.exec(name), sys.executable, "-m", "tests.chaos._partition_host", name],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    host = Host(name, proc)
    threading.Thread(target=host.read, daemon=True).start()
    return host


@pytest.fixture
def lab() -> Iterator[Lab]:
    """The namespaces, Redis, the Space and two hosts; all removed, even on failure."""
    if (why := unavailable()) is not None:
        pytest.skip(why)
    net = NetLab(["redis", "space", "h1", "h2"])
    procs: list[subprocess.Popen[Any]] = []
    space: LabSpace | None = None
    try:
        net.up()
        procs.append(_start_redis(net))
        space = LabSpace(net)  # starting; the hosts start meanwhile (they retry)
        hosts = [_start_host(net, name, space) for name in ("h1", "h2")]
        procs += [h.proc for h in hosts]
        space.wait_ready()
        store = redis.Redis(host=net.ip["redis"], port=6379, socket_timeout=2)
        yield Lab(net, space, store, *hosts)
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
        if space is not None:
            space.stop()
        net.down()


@pytest.fixture
async def running(lab: Lab) -> AsyncIterator[Lab]:
    """The lab with both hosts serving (a first call answered by each)."""
    for host in (lab.h1, lab.h2):
        host.load(1)
    await until(lambda: all(any(a["kind"] == "ok" for a in h.answers) for h in (lab.h1, lab.h2)),
                60, "both hosts to serve")  # fmt: skip
    yield lab


def peak(intervals: list[tuple[float, float]], since: float, until_t: float) -> int:
    """The most calls at once at the Space between ``since`` and ``until_t``."""
    edges = sorted([(s, 1) for s, e in intervals if e > since and s < until_t]
                   + [(e, -1) for s, e in intervals if e > since and s < until_t])  # fmt: skip
    inside = top = 0
    for _, step in edges:
        inside += step
        top = max(top, inside)
    return top


def holders_deadlines(lab: Lab, now_ms: float) -> list[tuple[str, float]]:
    """The store's live owners that hold entries, with their liveness deadlines."""
    owners = lab.store.zrangebyscore(PREFIX + "owners", now_ms, "+inf", withscores=True)
    held = []
    for o, deadline in owners:
        name = o.decode() if isinstance(o, bytes) else str(o)
        if lab.store.zlexcount(PREFIX + "owned", f"[{name}\x01", f"[{name}\x01\xff"):
            held.append((name, float(deadline)))
    return held


async def oldest_unrenewed(lab: Lab, seconds: float) -> float:
    """For ``seconds``, every 50 ms: how long ago (server clock) was the store's least
    recently renewed lease renewed? A live holder renews every TTL/3 and fences its
    lease by 0.8 TTL; a ghost (a lease nobody holds) ages up to the TTL."""
    oldest = 0.0
    end = time.time() + seconds
    while time.time() < end:
        sec, usec = await asyncio.to_thread(lab.store.time)
        now_ms = sec * 1000 + usec / 1000
        # Past their deadline, leases are free already: the next script reclaims them.
        # Liveness is per owner: each owner's deadline covers all it holds (an owner
        # holding nothing stops renewing and is not counted).
        for _, deadline in await asyncio.to_thread(holders_deadlines, lab, now_ms):
            oldest = max(oldest, TTL_S - (deadline - now_ms) / 1000)
        await asyncio.sleep(0.05)
    return oldest


async def quiesce(lab: Lab) -> None:
    """Stop both loads; wait until the Space and the store are empty."""
    lab.h1.load(0)
    lab.h2.load(0)
    await until(lambda: lab.space.stats().in_flight == 0 and lab.leases() == 0, 3 * TTL_S,
                "an idle Space and an empty store")  # fmt: skip


async def test_partitions(running: Lab) -> None:
    """Redis cut from both hosts, then host 1 cut from Redis, then from everything
    (short and long): the cap holds at the Space except while a cut-off host's job
    cannot be reached, which ends within 1.5 s of the heal by that host's own cancel;
    no ghost lease after any heal; callers answered by their deadline; never a 500."""
    lab = running
    report = [await store_cut(lab), await host_store_cut(lab)]
    report += [await host_isolated(lab, CUT_SHORT_S), await host_isolated(lab, CUT_LONG_S)]
    print("\n".join(report))
    kinds = {a["kind"] for h in (lab.h1, lab.h2) for a in h.answers}
    assert kinds <= KINDS, f"unexpected answers: {kinds - KINDS}"


async def store_cut(lab: Lab) -> str:
    lab.h1.load(2)
    lab.h2.load(2)
    await asyncio.sleep(0.5)
    lab.net.cut("redis", "h1")
    lab.net.cut("redis", "h2")
    cut_at = time.time()  # once both cuts are in place (each is two `ip` runs: slow when loaded)
    await asyncio.sleep(CUT_STORE_S)
    heal_from = time.time()  # host 1 is healed before host 2
    lab.net.heal("redis", "h1")
    lab.net.heal("redis", "h2")
    healed_at = time.time()
    aged = await oldest_unrenewed(lab, 2.5)
    load_end = time.time()
    await quiesce(lab)
    starts = sorted(s for s, _ in await asyncio.to_thread(lab.space.intervals))
    # A lease granted just before the cut may reach the Space a little later.
    during = [round(s - cut_at, 2) for s in starts if cut_at + GRANTED_BEFORE_S < s < heal_from]
    after = [healed_at, *(s for s in starts if healed_at <= s <= load_end)]
    gap = max((b - a for a, b in itertools.pairwise(after)), default=99.0)
    assert during == [], f"calls started at the Space {during} s into the Redis cut"
    assert gap <= 1.0, f"an admission gap of {gap:.2f} s after the heal"
    assert aged <= GHOST_AGE_S, f"a lease nobody renewed for {aged:.2f} s: a ghost"
    return (f"Redis cut {CUT_STORE_S:.0f} s: longest admission gap after the heal "
            f"{gap:.2f} s, first start {after[1] - healed_at:.2f} s after it, "
            f"oldest lease renewal {aged:.2f} s ago")  # fmt: skip


async def host_store_cut(lab: Lab) -> str:
    lab.space.reset()
    lab.h1.load(2, delay=1.25 * TTL_S, timeout=3 * TTL_S)
    lab.h2.load(2, delay=0.3)
    await asyncio.sleep(0.5)
    cut_at = time.time()
    lab.net.cut("redis", "h1")
    await asyncio.sleep(CUT_HOST_S)
    lab.net.heal("redis", "h1")
    aged = await oldest_unrenewed(lab, 2.0)
    await quiesce(lab)
    top = peak(await asyncio.to_thread(lab.space.intervals), cut_at - 1.0, time.time())
    assert top <= CAP, f"{top} calls at once at the Space (cap {CAP})"
    assert aged <= GHOST_AGE_S, f"a lease nobody renewed for {aged:.2f} s: a ghost"
    return (f"host 1 cut from Redis {CUT_HOST_S:.0f} s: Space peak {top}, oldest lease "
            f"renewal {aged:.2f} s ago")  # fmt: skip


async def host_isolated(lab: Lab, cut_s: float) -> str:
    lab.space.reset()
    lab.h1.load(2, delay=3 * CUT_LONG_S, timeout=DEADLINE_S)
    await until(lambda: lab.space.stats().in_flight == 2, 10, "host 1's two long calls")
    sent_before = len(lab.h1.answers)
    cut_at = time.time()
    for peer in ("redis", "space", "h2"):
        lab.net.cut("h1", peer)
    lab.h2.load(2, delay=0.3)
    await asyncio.sleep(cut_s)
    for peer in ("redis", "space", "h2"):
        lab.net.heal("h1", peer)
    healed_at = time.time()
    lab.h1.load(0)
    await until(lambda: len([i for i in lab.space.intervals() if i[0] < cut_at]) >= 2, 5,
                "host 1's jobs to end at the Space")  # fmt: skip
    await quiesce(lab)
    intervals = await asyncio.to_thread(lab.space.intervals)
    ends = [e for s, e in intervals if s < cut_at]
    late = max(ends) - healed_at
    over = [e - cut_at for e in ends]
    cut_off = [a for a in lab.h1.answers[sent_before:] if a["sent"] < cut_at + 0.1]
    assert late <= 1.5, f"host 1's jobs ended {late:.2f} s after the heal"
    assert cut_off and all(a["done"] < healed_at for a in cut_off), "answered after the heal"
    assert all(a["done"] - a["sent"] <= DEADLINE_S + 0.5 for a in cut_off), "past the deadline"
    kinds = sorted({a["kind"] for a in cut_off})
    top = peak(intervals, cut_at, time.time())
    return (f"host 1 cut from everything {cut_s:.0f} s: its jobs ended {late:+.2f} s from the "
            f"heal ({max(over):.2f} s after the cut); its callers got {kinds} while cut off; "
            f"Space peak {top} (cap {CAP}) while its jobs could not be reached")  # fmt: skip
