"""Resilience across two real processes sharing a SQLite file or a Redis prefix.

Each test drives worker processes (:mod:`tests.pool._resilience_worker`) step by step
over their stdin and checks that window, breaker and wake deadline are one per Space
for the fleet: what one process learns, the other acts on. Steps are ordered by
polling a worker's answers (or the store) with a deadline, never by sleeping.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from devspaces import SpaceFleet, SpaceProcess
from pool.admission import SPACE_PREFIX, AdmissionSnapshot, open_coordinator
from pool.resilience._board import KEY_PREFIX
from tests.admission.conftest import make_url

ROOT = Path(__file__).resolve().parents[2]
BASE_ENV = {
    "POOL_BREAKER_FAILURES": "3",
    "POOL_RETRY_ATTEMPTS": "2",
    "POOL_RETRY_BACKOFF_S": "0.01",
    "POOL_MIN_CONNECTIONS": "1",
    "POOL_HEALTH_INTERVAL_S": "0.5",  # maintenance (and the board's refresh) every 0.5 s
    "POOL_LEASE_TTL_S": "5",
}


class Worker:
    """One worker process and its line-by-line conversation."""

    def __init__(self, env: dict[str, str], args: list[str]) -> None:
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in wait_stopped()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.pool._resilience_worker", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            env=env, cwd=ROOT, text=True,
        )  # fmt: skip
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-3000:].decode(errors="replace")

    def answer(self, timeout_s: float = 30.0) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"worker silent for {timeout_s} s:\n{self._tail()}") from None
        if line is None:
            self.proc.wait(5)
            raise AssertionError(f"worker exited ({self.proc.returncode}):\n{self._tail()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, op: str, timeout_s: float = 30.0, **fields: object) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        return self.answer(timeout_s)

    def quit(self) -> None:
        """Ask the worker to close its pool and exit (without waiting for it)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
        except OSError:
            pass  # it is gone already

    def wait_stopped(self) -> None:
        """Wait for the exit that ``quit`` asked for; kill a worker that does not go."""
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        finally:
            self._reader.join(5)
            self._stderr.close()
            if self.proc.stdout is not None and not self._reader.is_alive():
                self.proc.stdout.close()


Start = Callable[..., list[Worker]]


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh shared store: a SQLite file, or a private Redis prefix."""
    yield from make_url(request.param, tmp_path, "resilience")


@pytest.fixture
def start_workers() -> Iterator[Start]:
    """``start_workers(env, ..., args=[...])``: one process per env, all ready; stopped
    (and killed if they do not quit) at the end."""
    started: list[Worker] = []

    def start(*envs: dict[str, str], args: tuple[str, ...] = ()) -> list[Worker]:
        workers = [Worker(env, list(args)) for env in envs]
        started.extend(workers)
        for worker in workers:
            assert worker.answer(60) == {"ready": True}
        return workers

    yield start
    for worker in started:
        worker.quit()  # all at once: they close their pools in parallel
    for worker in started:
        worker.wait_stopped()


def worker_env(fleet: SpaceFleet, url: str, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POOL_")}
    env.update(BASE_ENV, POOL_SPACES=fleet.pool_spaces_env(), POOL_COORDINATOR_URL=url)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(overrides)
    return env


def shared_view(url: str, name: str) -> tuple[AdmissionSnapshot, dict[str, Any]]:
    """What the store itself says: its admission snapshot and ``name``'s shared health
    record, read through a coordinator of the test process."""

    async def read() -> tuple[AdmissionSnapshot, dict[str, Any]]:
        coordinator = open_coordinator(url, lease_ttl_s=5.0)
        try:
            snapshot = await coordinator.snapshot()
            raw = await coordinator.values.get(KEY_PREFIX + name)
        finally:
            await coordinator.aclose()
        assert raw is not None, f"no shared health record for {name}"
        record: dict[str, Any] = json.loads(raw)
        return snapshot, record

    return asyncio.run(read())


def poll(what: str, check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    """Call ``check`` until it is true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s} s: {what}")
        time.sleep(0.1)


def break_alpha(worker: Worker) -> list[tuple[str, int, str]]:
    """Send requests through ``worker`` until alpha's breaker opens; the window trace."""
    trace: list[tuple[str, int, str]] = []
    for _ in range(10):
        (outcome,) = worker.ask("predict", n=1, watch="alpha")["outcomes"]
        trace.append((outcome.get("space", outcome.get("error")), outcome["window"],
                      outcome["breaker"]))  # fmt: skip
        if outcome["breaker"] == "open":
            return trace
    raise AssertionError(f"alpha's breaker never opened: {trace}")


def test_open_breaker_reaches_a_process_started_later(
    clean_fleet: SpaceFleet, store_url: str, start_workers: Start
) -> None:
    """A opens alpha's breaker; B, started afterwards, never calls alpha and reports
    window 1 and the breaker open; the store's limit for space:alpha is that window."""
    alpha, beta = clean_fleet["alpha"], clean_fleet["beta"]
    env = worker_env(clean_fleet, store_url, POOL_BREAKER_COOLDOWN_S="60")
    (a,) = start_workers(env)
    alpha.control(mode="queue_full")
    try:
        trace = break_alpha(a)
        print("window trace (A, alpha queue full):", trace)
        assert [w for _, w, _ in trace] == [2, 1, 1]
        assert {space for space, _, _ in trace} == {"beta"}, "A's requests failed over"
        refused = alpha.stats().refused
        assert refused == 3

        (b,) = start_workers(env)
        outcomes = b.ask("predict", n=6, watch="alpha")["outcomes"]
        assert [o.get("space") for o in outcomes] == ["beta"] * 6
        assert all(o["attempts"] == 1 for o in outcomes), "B never tried alpha first"
        assert alpha.stats().refused == refused, "B sent nothing to alpha"
        assert beta.stats().total == len(trace) + 6
        seen = b.ask("stats")["alpha"]
        assert seen["window"]["current"] == 1
        assert seen["breaker"]["state"] == "open"
        assert seen["breaker"]["openUntil"] is not None
        snapshot, record = shared_view(store_url, "alpha")
        assert snapshot.limits[SPACE_PREFIX + "alpha"] == record["window"] == 1
        assert record["breaker"] == "open"
    finally:
        alpha.control(mode="ok")


def test_probe_in_one_process_closes_the_breaker_for_both(
    clean_fleet: SpaceFleet, store_url: str, start_workers: Start
) -> None:
    """After alpha recovers and the cool-down passes, B's probe closes the breaker; A
    sees it closed, A's successes make the window climb, and B sees the climb."""
    alpha = clean_fleet["alpha"]
    env = worker_env(clean_fleet, store_url, POOL_BREAKER_COOLDOWN_S="1.5")
    a, b = start_workers(env, env)
    alpha.control(mode="queue_full")
    try:
        break_alpha(a)
        poll("B sees alpha's breaker open",
             lambda: b.ask("stats")["alpha"]["breaker"]["state"] == "open")  # fmt: skip
    finally:
        alpha.control(mode="ok")
    refused = alpha.stats().refused

    # B's traffic goes to beta until the cool-down ends; then its next request probes.
    served: list[dict[str, Any]] = []

    def probed() -> bool:
        served.extend(b.ask("predict", n=1, watch="alpha")["outcomes"])
        return served[-1].get("space") == "alpha"

    poll("B's request probes alpha", probed, timeout_s=10)
    assert {o.get("space") for o in served[:-1]} <= {"beta"}
    assert (served[-1]["breaker"], served[-1]["window"]) == ("closed", 1)
    assert alpha.stats().refused == refused, "no request reached alpha before the probe"

    poll("A sees the breaker closed",
         lambda: a.ask("stats")["alpha"]["breaker"]["state"] == "closed")  # fmt: skip
    assert a.ask("stats")["alpha"]["window"]["current"] == 1
    climb = a.ask("predict", n=6, space="alpha", watch="alpha")["outcomes"]
    print("window trace (A, alpha recovered):", [o["window"] for o in climb])
    assert [o["space"] for o in climb] == ["alpha"] * 6
    assert [o["window"] for o in climb] == [1, 1, 2, 2, 2, 3]
    poll("B sees the window climb", lambda: b.ask("stats")["alpha"]["window"]["current"] == 3)
    snapshot, record = shared_view(store_url, "alpha")
    assert snapshot.limits[SPACE_PREFIX + "alpha"] == record["window"] == 3
    assert record["breaker"] == "closed"


def test_wake_deadline_is_shared_across_processes(
    clean_fleet: SpaceFleet, store_url: str, start_workers: Start
) -> None:
    """A wakes a sleeping Space; B's request for it waits past B's own 1 s deadline
    (the shared one holds), calls no wake and does not fail over; both are served."""
    # Hold the port (bound, not listening: connections are refused) so that no other
    # process on the machine takes it before the stand-in does.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        spaces = f"sleepy=http://127.0.0.1:{port}/,{clean_fleet.pool_spaces_env()}"
        common = {"POOL_SPACES": spaces, "POOL_WAKE_POLL_S": "0.25"}
        env_a = worker_env(clean_fleet, store_url, POOL_WAKE_TIMEOUT_S="40", **common)
        env_b = worker_env(clean_fleet, store_url, POOL_WAKE_TIMEOUT_S="1", **common)
        a, b = start_workers(env_a, env_b, args=("--sleeping", "sleepy"))

        def waiting(worker: Worker, request: str) -> bool:
            ticket = worker.ask("ticket", id=request)
            assert not ticket["done"], worker.ask("finish", id=request)
            return bool(ticket["stage"] == "waking")

        a.ask("begin", id="a1")
        poll("A waits for the wake", lambda: waiting(a, "a1"))
        _snapshot, record = shared_view(store_url, "sleepy")
        assert record["wake_until"] > time.time() + 30, "A's 40 s deadline is in the store"
        b.ask("begin", id="b1")
        poll("B waits for the wake", lambda: waiting(b, "b1"))
        b_waiting = time.monotonic()
        assert b.ask("stats")["sleepy"]["wake"]["state"] == "waking"

        def b_still_waiting_past_its_own_deadline() -> bool:
            ticket = b.ask("ticket", id="b1")
            assert ticket["stage"] == "waking" and not ticket["done"], ticket
            return time.monotonic() - b_waiting > 1.5

        poll("B waits longer than its own deadline", b_still_waiting_past_its_own_deadline)
    sleepy = SpaceProcess("sleepy", port=port, wait=False)  # the port is free, it boots now
    try:
        done_a = a.ask("finish", id="a1", timeout_s=60)
        done_b = b.ask("finish", id="b1", timeout_s=60)
        assert done_a["outcome"]["space"] == "sleepy", done_a
        assert done_b["outcome"]["space"] == "sleepy", done_b
        assert done_b["outcome"]["result"] == "sleepy:b1"
        assert done_a["outcome"]["attempts"] == done_b["outcome"]["attempts"] == 1
        assert done_a["stage"] == done_b["stage"] == "queued"
        assert sleepy.stats().total == 2
        assert sum(space.stats().total for space in clean_fleet) == 0, "nobody failed over"
        calls_a = [tuple(c) for c in a.ask("calls")["calls"]]
        calls_b = [tuple(c) for c in b.ask("calls")["calls"]]
        print(f"wake: A waited {done_a['outcome']['took']:.1f} s, B {done_b['outcome']['took']:.1f}"
              f" s; Hub calls A {calls_a}, B {calls_b}")  # fmt: skip
        assert calls_a.count(("wake", "sleepy")) == 1
        assert ("wake", "sleepy") not in calls_b, calls_b
        assert ("restart", "sleepy") not in calls_a + calls_b
        _snapshot, record = shared_view(store_url, "sleepy")
        assert record["wake_until"] == 0.0, "the wake ended for the fleet"
    finally:
        sleepy.stop()


def test_idle_pause_waits_for_the_fleet_and_is_claimed_once(
    clean_fleet: SpaceFleet, store_url: str, start_workers: Start
) -> None:
    """B never pauses alpha while A's request runs on it; once idle, exactly one process
    pauses it, and the other one's next request for it restarts it."""
    env = worker_env(
        clean_fleet, store_url,
        POOL_IDLE_PAUSE_S="0.5", POOL_MIN_UPTIME_S="1.5", POOL_PAUSE_SPACES="alpha",
    )  # fmt: skip
    (a,) = start_workers(env)
    # Long enough to outlast B's start on a loaded machine (seen: a 5 s request ended
    # before B was up and had been watched for two ticks, in a CI run).
    a.ask("begin", id="long", space="alpha", delay=8.0)
    begun = time.monotonic()  # alpha's record was created a moment ago, by A's start
    held = SPACE_PREFIX + "alpha"
    poll("A holds a lease on alpha", lambda: shared_view(store_url, "alpha")[0].held.get(held) == 1)
    (b,) = start_workers(env)
    # From here only A's lease keeps alpha from being paused (idle period and up-time
    # are over); watch two of B's maintenance ticks (0.5 s) while it runs.
    watch_until = max(begun + 1.5, time.monotonic()) + 1.0

    def watched_while_busy() -> bool:
        assert not a.ask("ticket", id="long")["done"], "A's request ended too soon to check"
        for worker in (a, b):
            assert ("pause", "alpha") not in [tuple(c) for c in worker.ask("calls")["calls"]]
        return time.monotonic() > watch_until

    poll("the busy period was watched", watched_while_busy)
    done = a.ask("finish", id="long")
    assert done["outcome"]["space"] == "alpha", done
    idle_from = done["outcome"]["ended_at"]  # not when the answer reached us (later, loaded)

    def both_see_paused() -> bool:
        return all(w.ask("stats")["alpha"]["wake"]["state"] == "paused" for w in (a, b))

    poll("both processes see alpha paused", both_see_paused, timeout_s=10)
    assert time.monotonic() - idle_from >= 0.4, "not before the idle period"
    calls = {name: [tuple(c) for c in w.ask("calls")["calls"]] for name, w in (("a", a), ("b", b))}
    pausers = [name for name, seen in calls.items() if ("pause", "alpha") in seen]
    print(f"idle pause: by {pausers}; Hub calls {calls}")
    assert len(pausers) == 1 and calls[pausers[0]].count(("pause", "alpha")) == 1, calls
    assert all(("pause", "beta") not in seen for seen in calls.values())
    other = b if pausers == ["a"] else a
    (outcome,) = other.ask("predict", n=1, space="alpha")["outcomes"]
    assert outcome["space"] == "alpha", outcome
    assert ("restart", "alpha") in [tuple(c) for c in other.ask("calls")["calls"]]
    _snapshot, record = shared_view(store_url, "alpha")
    assert record["paused"] is False
