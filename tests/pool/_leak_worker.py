"""One run of the leak test, in a process of its own: baseline, hard use, close, measure.

    python -m tests.pool._leak_worker pool  --store URL     # the library (Pool.aclose)
    python -m tests.pool._leak_worker app   --store URL     # the service (app lifespan)
    python -m tests.pool._leak_worker stuck --store URL --freeze-pid PID  # Space frozen

``POOL_SPACES`` names two stand-in Spaces (alpha, beta), or for ``stuck`` one (ice)
whose process the worker freezes (SIGSTOP) and thaws again; ``POOL_TRANSPORT`` picks
the transport (native by default). Prints one JSON line:
``{"baseline": S, "peak": S, "after": S, "close_s": seconds, ...}`` where each S is
``{"threads": [names], "non_daemon": [names], "os_threads": n, "fds": {fd: target}}``.
The baseline is taken once everything is imported and the event loop runs, before the
pool is built; "after" right after ``aclose()`` (or the lifespan's shutdown) returns,
with no wait; in ``pool`` runs, "after_late_calls" once calls made after ``aclose()``
(a caller still holding a connection, a stats call) have returned, with their outcomes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import json
import os
import signal
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

# Imported before the baseline: importing opens nothing that stays, but keeps the
# measurement about what the pool does, not about what Python loads lazily.
import gradio_client  # noqa: F401
import httpx
import psutil
import redis.asyncio  # noqa: F401

from pool import DeadlineExceeded, Pool, PoolError, PoolSettings, UpstreamStarted

NATIVE = os.environ.get("POOL_TRANSPORT", "native") == "native"

_BOUND_S = 10.0  # every wait below gives up after this
_HANG_S = 240.0  # a hang guard only: stacks of every thread, then exit (not a measure)


def snapshot() -> dict[str, Any]:
    """This process's threads (names, non-daemon ones apart) and open fds (targets)."""
    fds: dict[str, str] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the fd of the listdir itself, closed meanwhile
            continue
    threads = threading.enumerate()
    return {
        "threads": sorted(t.name for t in threads),
        "non_daemon": sorted(t.name for t in threads if not t.daemon),
        "os_threads": len(os.listdir("/proc/self/task")),
        "fds": fds,
    }


async def settled(baseline: dict[str, Any]) -> dict[str, Any]:
    """A snapshot once the OS has reaped the threads Python already let go: a thread
    leaves ``threading.enumerate()`` before its OS thread has exited (a moment later),
    so /proc/self/task may count one more for a few ms. Waits at most 1 s: a thread that
    still runs then (a leak, Python's or C's) is in the snapshot."""
    deadline = time.monotonic() + 1.0
    while len(os.listdir("/proc/self/task")) > baseline["os_threads"]:
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.01)
    return snapshot()


def settings(store: str, **extra: Any) -> PoolSettings:
    values: dict[str, Any] = {
        "spaces": os.environ["POOL_SPACES"],
        "coordinator_url": store,
        "min_connections": 1,
        "max_connections": 4,
        "idle_timeout_s": 0.5,  # extra connections are reaped within the run
        "warm_window_s": 0.5,  # (once the peak in use has left the warm window)
        "health_interval_s": 300.0,  # the round is run by hand below
        "global_max_concurrent": 16,
        "consumer_max_concurrent": 16,
        "queue_timeout_s": 10.0,
        "lease_ttl_s": 3.0,
        "client_max_workers": 2,
        "read_timeout_s": 30.0,
    }
    values.update(extra)
    return PoolSettings(**values)


async def until(check: Any, what: str) -> None:
    """Poll ``check()`` every 20 ms, at most ``_BOUND_S``."""
    deadline = time.monotonic() + _BOUND_S
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {_BOUND_S} s")
        await asyncio.sleep(0.02)


async def use_hard(pool: Pool, peak: list[dict[str, Any]]) -> None:
    """Parallel predicts on both Spaces, a job cancelled mid-run, a timeout, a health
    round, connections reaped; ``peak`` gets the snapshot with the most threads (then fds)."""

    def note() -> None:
        snap = snapshot()
        size = (len(snap["threads"]), len(snap["fds"]))
        if not peak or size > (len(peak[0]["threads"]), len(peak[0]["fds"])):
            peak[:] = [snap]

    async def sample() -> None:  # the peak, sampled every 20 ms while the work runs
        while True:
            note()
            await asyncio.sleep(0.02)

    sampler = asyncio.get_running_loop().create_task(sample())
    try:
        await _use(pool)
    finally:
        sampler.cancel()
        note()


async def running_job(pool: Pool, space: str) -> asyncio.Task[Any]:
    """A task holding a connection to ``space`` whose 30 s job runs there now."""
    from gradio_client.utils import Status

    loop = asyncio.get_running_loop()
    running: asyncio.Future[Any] = loop.create_future()

    async def hold() -> Any:
        async with pool.client(space=space) as handle:
            job = await handle.submit("slow", 30.0, api_name="/echo")
            running.set_result(job)
            return await job

    task = loop.create_task(hold())
    job = await asyncio.wait_for(running, _BOUND_S)
    if NATIVE:
        async with asyncio.timeout(_BOUND_S):
            async for event in job.events():
                if isinstance(event, UpstreamStarted):
                    break
    else:
        await until(lambda: job.status().code == Status.PROCESSING, "the job runs")
    return task


async def _use(pool: Pool) -> None:

    async def one(i: int) -> None:
        space = "alpha" if i % 2 else "beta"
        done = await pool.predict("/echo", f"x{i}", 0.3, space=space, timeout=_BOUND_S)
        assert done.result == f"{space}:x{i}", done

    # 1. Parallel predicts: both Spaces grow to their max of 4 connections.
    await asyncio.gather(*(one(i) for i in range(16)))

    # 2. A job cancelled while it runs on the Space.
    task = await running_job(pool, "alpha")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

    # 3. A timeout: the upstream job is cancelled, DeadlineExceeded raised.
    try:
        await pool.predict("/echo", "late", 30.0, space="beta", timeout=1.0)
    except DeadlineExceeded:
        pass
    else:
        raise AssertionError("the timeout did not fire")

    # 4. A health round over the idle connections.
    await pool.health_check()
    assert pool.last_health_check is not None

    # 5. The idle connections above the minimum are reaped by the maintenance loop.
    await until(
        lambda: all(sp.total <= sp.min_size for sp in pool.spaces.values()),
        "idle connections reaped",
    )


async def run_pool(store: str) -> dict[str, Any]:
    baseline = snapshot()
    peak: list[dict[str, Any]] = []
    pool = Pool(settings(store))
    try:
        await use_hard(pool, peak)
        left_running = await running_job(pool, "beta")  # aclose() while a job runs
    finally:
        began = time.monotonic()
        await pool.aclose()
        close_s = time.monotonic() - began
    after = await settled(baseline)
    # Late calls, after aclose(): the running job's caller releases, a stats call
    # asks the store. Neither may reopen anything.
    outcomes: dict[str, str] = {}
    for name, late in (("left_running", left_running), ("stats", pool.stats())):
        try:
            await asyncio.wait_for(late, _BOUND_S)
            outcomes[name] = "finished"
        except PoolError as exc:
            outcomes[name] = type(exc).__name__
    return {
        "baseline": baseline,
        "peak": peak[0],
        "after": after,
        "after_late_calls": snapshot(),
        "close_s": close_s,
        **outcomes,
    }


async def run_stuck(store: str, freeze_pid: int) -> dict[str, Any]:
    """aclose() while the only Space (``ice``, process ``freeze_pid``) is frozen: one
    job waits for its ``/queue/join`` answer, one Client for its ``/config``."""
    baseline = snapshot()
    pool = Pool(settings(store, min_connections=1, max_connections=2))
    port = urlsplit(pool.spaces["ice"].spec.src).port

    def to_ice() -> int:  # our open TCP connections to the Space
        return sum(
            1
            for c in psutil.Process().net_connections(kind="tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
        )

    def unread_at_ice() -> int:
        """Sockets of the frozen Space holding request bytes it has not read (the
        kernel still accepts them: /proc/net/tcp's rx_queue). The native transport
        reuses kept-alive connections, so counting connections would not tell."""
        count = 0
        with open("/proc/net/tcp") as table:
            for line in list(table)[1:]:
                fields = line.split()
                local, state, queues = fields[1], fields[3], fields[4]
                established = state == "01"  # (a closed one holds its FIN there)
                if int(local.split(":")[1], 16) == port and established and int(
                    queues.split(":")[1], 16
                ):
                    count += 1
        return count

    async def job() -> Any:
        async with pool.client(space="ice") as handle:  # the idle connection
            return await handle.predict("stuck", 0.0, api_name="/echo")

    async def second() -> Any:
        async with pool.client(space="ice"):  # needs a second connection: opens one
            return None

    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[Any]] = []
    try:
        await pool.predict("/echo", "warm", 0.0, space="ice", timeout=_BOUND_S)
        if NATIVE:
            os.kill(freeze_pid, signal.SIGSTOP)
            tasks.append(loop.create_task(job()))
            await until(lambda: unread_at_ice() == 1, "the job's /queue/join is sent")
            tasks.append(loop.create_task(second()))
            await until(lambda: unread_at_ice() == 2, "the new connection's probe is sent")
        else:
            await until(lambda: to_ice() == 1, "only the heartbeat stream is open")
            os.kill(freeze_pid, signal.SIGSTOP)
            tasks.append(loop.create_task(job()))
            await until(lambda: to_ice() == 2, "the job's /queue/join is sent")
            tasks.append(loop.create_task(second()))
            await until(lambda: to_ice() == 3, "the new Client's /config is sent")
        peak = snapshot()
    finally:
        began = time.monotonic()
        await pool.aclose()
        close_s = time.monotonic() - began
        after = await settled(baseline)
        os.kill(freeze_pid, signal.SIGCONT)
    outcomes = []
    for task in tasks:
        try:
            await asyncio.wait_for(task, _BOUND_S)
            outcomes.append("finished")
        except PoolError as exc:
            outcomes.append(type(exc).__name__)
    return {
        "baseline": baseline,
        "peak": peak,
        "after": after,
        "close_s": close_s,
        "outcomes": outcomes,
    }


async def run_app(store: str) -> dict[str, Any]:
    from app.main import create_app
    from pool import set_pool

    baseline = snapshot()
    peak: list[dict[str, Any]] = []
    pool = Pool(settings(store))
    set_pool(pool)
    application = create_app()
    transport = httpx.ASGITransport(app=application)
    lifespan = application.router.lifespan_context(application)
    await lifespan.__aenter__()
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as http:
            body = {"api_name": "/echo", "args": ["hi", 0.2]}
            answers = await asyncio.gather(
                *(http.post("/api/predict", json=body) for _ in range(8))
            )
            assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
            job = await http.post("/api/jobs", json={"api_name": "/echo", "args": ["j", 30.0]})
            assert job.status_code in (200, 201, 202), job.text
        await use_hard(pool, peak)
    finally:
        began = time.monotonic()
        await lifespan.__aexit__(None, None, None)  # cancels the running job, closes the pool
        close_s = time.monotonic() - began
        set_pool(None)
    after = await settled(baseline)
    return {"baseline": baseline, "peak": peak[0], "after": after, "close_s": close_s}


async def _guarded(run: Any) -> dict[str, Any]:
    """``run``, with every asyncio task's stack written to stderr shortly before the
    hang guard fires (faulthandler shows the threads, not what the coroutines await)."""
    loop = asyncio.get_running_loop()

    def dump() -> None:
        for task in asyncio.all_tasks(loop):
            task.print_stack(limit=12, file=sys.stderr)

    timer = loop.call_later(_HANG_S - 5.0, dump)
    try:
        return dict(await run)
    finally:
        timer.cancel()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("pool", "app", "stuck"))
    parser.add_argument("--store", required=True)
    parser.add_argument("--freeze-pid", type=int, default=0)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(_HANG_S, exit=True)
    if args.what == "stuck":
        run = run_stuck(args.store, args.freeze_pid)
    else:
        run = (run_pool if args.what == "pool" else run_app)(args.store)
    result = asyncio.run(_guarded(run))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
