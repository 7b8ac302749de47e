"""No leaks: after ``aclose()`` the process has the threads and fds it had before.

Each run is a fresh interpreter (``tests/pool/_leak_worker.py``) so that pytest's own
threads and files do not blur the baseline: it takes the baseline once everything is
imported and the event loop runs, uses the pool hard against the two stand-in Spaces
(parallel predicts on both, a job cancelled mid-run, a timeout, a health round, idle
connections reaped, and one job still running when the pool closes), closes it and
measures again at once — no grace period. A last run freezes its Space (SIGSTOP) so
that a job and a Client being opened wait on requests that get no answer. Threads are
compared by name (and the kernel's count of the process's tasks), fds by number and
target: exactly equal.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from devspaces import SpaceFleet, SpaceProcess
from pool.transport._fallback import GradioFactory, close_client
from tests.admission.conftest import STORES, make_url

ROOT = Path(__file__).resolve().parents[2]
_CLOSE_BOUND_S = 3.0  # measured 0.02-0.12 s; a loaded 2-core machine gets margin
# pytest-timeout's limit for these tests: a hang guard only (the worker's watchdog,
# _HANG_S = 240 s, fires first and prints where it hung); imports and start-up
# stretched by load (a run at load 7-11 went past 60 s) are not a failure.
pytestmark = pytest.mark.timeout(300)


def _run(
    what: str, store: str, spaces: str, tmp_path: Path, *extra: str, transport: str = "native"
) -> dict[str, Any]:
    """One worker run over a fresh store of kind ``store``: its measurement."""
    with contextlib.contextmanager(make_url)(store, tmp_path) as url:
        env = {**os.environ, "POOL_SPACES": spaces, "PYTHONPATH": str(ROOT),
               "POOL_TRANSPORT": transport}  # fmt: skip
        command = [sys.executable, "-W", "error", "-W", "ignore::DeprecationWarning",
                   "-W", "always::ResourceWarning",
                   "-m", "tests.pool._leak_worker", what, "--store", url, *extra]  # fmt: skip
        # No wall-clock limit here: every wait in the worker has its own bound
        # (_leak_worker._BOUND_S, failing with what did not happen) and the checks are
        # on what is left open, so a loaded machine only makes the run slower. The
        # worker's own watchdog (faulthandler, _HANG_S) ends a real hang with stacks.
        out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]
    for bad in ("Traceback", "ResourceWarning", "never retrieved", "still running"):
        assert bad not in out.stderr, out.stderr[-4000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["stderr"] = out.stderr[-3000:]  # names a task cancel_and_wait had to cancel again
    return result


def _assert_back_to_baseline(
    result: dict[str, Any], *, min_threads: int = 10, transport: str = "native"
) -> None:
    base, peak, after = result["baseline"], result["peak"], result["after"]
    # The run really opened what must be closed (else this test could not fail).
    if transport == "native":  # sockets, no thread (a SQLite store has its own one)
        extra = set(peak["threads"]) - set(base["threads"]) - {"spacepool-sqlite"}
        assert not extra, peak["threads"]
    else:
        assert any("_stream_heartbeat" in name for name in peak["threads"]), peak["threads"]
        assert any(name.startswith("spacepool-io") for name in peak["threads"]), peak["threads"]
        assert len(peak["threads"]) >= len(base["threads"]) + min_threads, peak["threads"]
    assert len(peak["fds"]) > len(base["fds"]), peak["fds"]
    assert after["threads"] == base["threads"], after["threads"]
    assert after["non_daemon"] == base["non_daemon"]
    assert after["os_threads"] == base["os_threads"]
    assert after["fds"] == base["fds"], {"before": base["fds"], "after": after["fds"]}
    assert result["close_s"] < _CLOSE_BOUND_S, (result["close_s"], result["stderr"])


@pytest.mark.parametrize(
    ("store", "transport"), [*((s, "native") for s in STORES), ("memory", "gradio_client")]
)
def test_pool_aclose_returns_threads_and_fds_to_baseline(
    store: str, transport: str, clean_fleet: SpaceFleet, tmp_path: Path
) -> None:
    """Pool.aclose() ends every thread and closes every fd the pool opened, per store
    (and on the fallback transport); the native transport opens no thread at all."""
    result = _run("pool", store, clean_fleet.pool_spaces_env(), tmp_path, transport=transport)
    _assert_back_to_baseline(result, transport=transport)
    if store == "sqlite":
        assert any(n == "spacepool-sqlite" for n in result["peak"]["threads"])
    # The job still running at close failed with a typed error; it did not run on.
    assert result["left_running"] != "finished", result["left_running"]
    # Calls after aclose() reopen nothing (no reconnect to Redis, no reopened file).
    assert result["after_late_calls"]["threads"] == result["baseline"]["threads"]
    assert result["after_late_calls"]["fds"] == result["baseline"]["fds"]


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_service_shutdown_returns_threads_and_fds_to_baseline(
    store: str, clean_fleet: SpaceFleet, tmp_path: Path
) -> None:
    """The app's lifespan shutdown (a job running, shared job store) leaves nothing."""
    _assert_back_to_baseline(_run("app", store, clean_fleet.pool_spaces_env(), tmp_path))


@pytest.mark.parametrize("transport", ["native", "gradio_client"])
def test_aclose_cuts_requests_to_a_space_that_stopped_answering(
    transport: str, tmp_path: Path
) -> None:
    """A frozen Space: aclose() ends a job waiting on /queue/join and a connection being
    opened at once (not at the 30 s read timeout), and leaves nothing behind."""
    with SpaceProcess("ice") as ice:
        try:
            result = _run("stuck", "memory", f"ice={ice.url}", tmp_path,
                          "--freeze-pid", str(ice.pid), transport=transport)  # fmt: skip
        finally:
            os.kill(ice.pid, signal.SIGCONT)  # the worker thaws it too; never leave it frozen
    _assert_back_to_baseline(result, min_threads=3, transport=transport)
    # The waiting job fails as cancelled by the close; the connection being opened too.
    assert result["outcomes"] == ["PoolClosedError", "PoolClosedError"], result


def test_close_client_ends_every_thread_of_a_client_at_once(clean_fleet: SpaceFleet) -> None:
    """close_client() cuts a Client's streams: its heartbeat, result reader and job
    threads end within 1 s (not at the server's next 15 s ping), the job with them."""
    from gradio_client.utils import Status

    open_client = GradioFactory(
        token=None, connect_timeout_s=5.0, read_timeout_s=30.0, max_workers=2
    )
    alpha = clean_fleet["alpha"]
    before = alpha.stats().in_flight
    client = open_client(alpha.url)
    # 3 s: the Space runs a job whose stream was cut to its end (close_client posts no
    # /cancel; the pool does, before closing), and later tests share this Space.
    job = client.submit("slow", 3.0, api_name="/echo")
    deadline = time.monotonic() + 10
    while job.status().code != Status.PROCESSING:
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.02)
    threads = close_client(client)
    assert client.heartbeat in threads and len(threads) >= 4, threads
    ended_by = time.monotonic() + 1.0
    for thread in threads:
        thread.join(max(0.0, ended_by - time.monotonic()))
    assert [t.name for t in threads if t.is_alive()] == []
    assert job.done()
    with pytest.raises(concurrent.futures.CancelledError):  # as for a dropped stream
        job.result(timeout=0)
    drained_by = time.monotonic() + 10
    while alpha.stats().in_flight > before and time.monotonic() < drained_by:
        time.sleep(0.1)
