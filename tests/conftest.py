"""Shared fixtures: real stand-in Spaces (devspaces) and pools built against them."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import functools
import gc
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from devspaces import SpaceFleet, SpaceProcess
from pool import Clock, Pool, PoolSettings

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The stand-in Spaces' queue loops sleep while there is no work, woken by an arrival or
# a job's start, and poll every 10 ms (not Gradio's 1 ms) while events wait for a slot
# (devspaces/_app.py): the suite keeps tens of them up at once on 2 cores, and with
# Gradio's own loops each idle one took ~3 % of a core (0.7 % at 10 ms; 0.13 % now).
os.environ.setdefault("DEVSPACES_IDLE_POLL_S", "0.01")


def _serialize_ast_parse() -> None:
    """One ``ast.parse`` at a time in a test process. CPython 3.11.7 (the machines')
    keeps the AST constructor's recursion counter per interpreter, not per thread
    (cpython gh-106905, fixed in later releases): when one thread is suspended inside
    ``ast.parse`` (a garbage collection there runs finalizers, which let another thread
    in) and another thread parses meanwhile, the first fails with "SystemError: AST
    constructor recursion depth mismatch". Tests parse in several threads at once:
    hypothesis reads its strategies' lambdas (``hypothesis/internal/lambda_sources.py``),
    pytest rewrites plugin modules on import, and Python 3.11's ``traceback`` parses
    every line it underlines when a thread of an app under test logs an exception.
    Seen in CI as test_fuzz's hypothesis run failing while the app thread logged.

    ``compile`` converts too, both ways: an AST object in (pytest's assertion rewriting
    compiles the tree it rewrote, on an import in any thread) or ``PyCF_ONLY_AST`` out;
    those calls take the same lock. Seen: an xdist worker died of the mismatch while
    pytest parsed a failure's source to show it, and the whole run stopped with it.

    And no garbage collection while the lock is held: a collection inside the parse runs
    finalizers in the same thread — an asyncio task's "exception was never retrieved"
    is logged from its finalizer, and the log's traceback parses its lines — so the
    same thread parsed inside its own parse (the RLock lets it in) and the outer one
    failed (seen twice on 2026-12-06, each time stopping the run)."""
    parse = ast.parse
    lock = threading.RLock()

    @contextlib.contextmanager
    def alone() -> Iterator[None]:
        with lock:
            collecting = gc.isenabled()
            gc.disable()
            try:
                yield
            finally:
                if collecting:
                    gc.enable()

    @functools.wraps(parse)
    def serialized(*args: object, **kwargs: object) -> ast.AST:
        with alone():
            return parse(*args, **kwargs)  # type: ignore[arg-type]

    ast.parse = serialized  # type: ignore[assignment]

    import builtins

    plain_compile = builtins.compile

    @functools.wraps(plain_compile)
    def compile_serialized(source: object, *args: object, **kwargs: object) -> object:
        flags = args[2] if len(args) > 2 else kwargs.get("flags", 0)
        if isinstance(source, ast.AST) or int(flags) & ast.PyCF_ONLY_AST:  # type: ignore[call-overload]
            with alone():
                return plain_compile(source, *args, **kwargs)  # type: ignore[call-overload]
        return plain_compile(source, *args, **kwargs)  # type: ignore[call-overload]

    builtins.compile = compile_serialized  # type: ignore[assignment]


_serialize_ast_parse()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile`` dealing the longest files first (``tests/_schedule.py``)."""
    if config.getoption("dist") != "loadfile":
        return None
    from tests._schedule import LongestFirst

    return LongestFirst(config, log)


# The second stage of scripts/test (``-m stage2``; the first runs ``-m "not stage2"``):
# the benchmark smoke, the soak (both measurements over time) and every test that drives
# Chromium (the ``browser`` fixture), so that the first stage holds its wall-time budget
# (scripts/test says what it is).
STAGE2_FIXTURES = {"browser"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "stage2: runs in scripts/test's second stage (benchmark smoke, soak, browser)"
    )
    if not hasattr(config, "workerinput"):  # the controlling process (or the only one)
        from tests._schedule import Recorder

        config.pluginmanager.register(Recorder(config), "spacepool-test-seconds")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses a ``STAGE2_FIXTURES`` fixture is marked ``stage2``."""
    for item in items:
        if STAGE2_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.stage2)


@pytest.fixture(scope="session")
def fleet() -> Iterator[SpaceFleet]:
    """Two stand-in Spaces (alpha, beta) shared by the tests that do not break them."""
    with SpaceFleet(2) as spaces:
        yield spaces


@pytest.fixture(scope="session")
def stream_spaces() -> Iterator[dict[str, SpaceProcess]]:
    """Two more stand-ins: "streamer" (kind stream, a generator) and "chat" (ChatInterface)."""
    started = [SpaceProcess("streamer", kind="stream", wait=False)]
    try:
        started.append(SpaceProcess("chat", kind="chat", wait=False))
        for space in started:
            space.wait_ready()
        yield {space.name: space for space in started}
    finally:
        for space in started:
            space.stop()


@pytest.fixture(scope="session")
def talk() -> Iterator[SpaceProcess]:
    """A chat Space (a real gr.ChatInterface, history in gr.State) for the session tests;
    one of them restarts it, so it is theirs alone."""
    space = SpaceProcess("talk", kind="chat", wait=False)
    try:
        space.wait_ready(180)
        yield space
    finally:
        space.stop()


@pytest.fixture(scope="session")
def demo_spaces() -> Iterator[dict[str, SpaceProcess]]:
    """Gradio's own demo shapes, every one a gr.Interface whose endpoint is /predict:
    two replicas of "upper", "state" (interface_state) and "filename"."""
    kinds = {"upper-1": "upper", "upper-2": "upper", "state": "state", "filename": "filename"}
    started: list[SpaceProcess] = []
    try:
        for name, kind in kinds.items():
            started.append(SpaceProcess(name, kind=kind, wait=False))
        for space in started:
            space.wait_ready(180)
        yield {space.name: space for space in started}
    finally:
        for space in started:
            space.stop()


# One stand-in Space of every devspaces kind, named after its kind (test_conformance
# checks that no registered kind is missing).
EVERY_KIND = (
    "echo", "image", "stream", "chat", "shapes", "headers", "upper", "state", "filename",
    "zerogpu",
)  # fmt: skip


@pytest.fixture(scope="session")
def every_kind() -> Iterator[SpaceFleet]:
    """One Space of each kind, shared by the files that only call them (conformance,
    discovery); those files run on one worker (``SHARED_UNITS``), so it starts once."""
    # Ten Gradio processes start at once on a shared machine: allow for a slow start.
    with SpaceFleet(names=list(EVERY_KIND), kind=list(EVERY_KIND), startup_timeout_s=180) as f:
        yield f


@pytest.fixture(scope="session")
def zero() -> Iterator[SpaceProcess]:
    """A ZeroGPU-like stand-in (kind zerogpu: x-ip-token, a GPU quota per token)."""
    with SpaceProcess("zero", kind="zerogpu") as space:
        yield space


def spaces_env(spaces: dict[str, SpaceProcess]) -> str:
    """The POOL_SPACES value for ``spaces`` (name=URL, comma-separated)."""
    return ",".join(f"{name}={space.url}" for name, space in spaces.items())


@pytest.fixture
def clean_fleet(fleet: SpaceFleet) -> SpaceFleet:
    """The shared fleet with its counters zeroed and normal behaviour."""
    for space in fleet:
        space.control(mode="ok", config_delay_s=0.0)
        space.reset()
    return fleet


def make_settings(fleet: SpaceFleet, **overrides: object) -> PoolSettings:
    """Settings for a pool over ``fleet``; in-process admission unless overridden."""
    values: dict[str, object] = {
        "spaces": fleet.pool_spaces_env(),
        "coordinator_url": "memory://",
        "queue_timeout_s": 10.0,
    }
    values.update(overrides)
    return PoolSettings(**values)  # type: ignore[arg-type]


# The pool-stats keys SPEC section 5 promises (more are welcome).
SPEC5_KEYS = {
    "pools",
    "totalConnections",
    "availableConnections",
    "inUseConnections",
    "totalQueued",
    "userAssignments",
    "initialized",
    "healthCheckRunning",
    "lastHealthCheck",
}
SPEC5_POOL_KEYS = {
    "totalConnections",
    "availableConnections",
    "inUseConnections",
    "queueLength",
    "healthyConnections",
    "unhealthyConnections",
}

PoolMaker = Callable[..., Pool]


@pytest.fixture
def transport() -> str:
    """The transport ``make_pool`` builds pools on. A test module that defines its own
    ``transport`` fixture with ``params=TRANSPORTS`` runs every test on both: the
    behaviour is the interface's (pool/transport/_interface.py), not one transport's."""
    return "native"


TRANSPORTS = ["native", "gradio_client"]


@pytest.fixture
async def make_pool(transport: str) -> AsyncIterator[PoolMaker]:
    """Build pools over a fleet (``make_pool(fleet, **settings)``); closed at the end."""
    pools: list[Pool] = []

    def build(fleet: SpaceFleet, *, clock: Clock | None = None, **kw: object) -> Pool:
        extra = {"clock": clock} if clock is not None else {}
        kw.setdefault("transport", transport)
        p = Pool(make_settings(fleet, **kw), **extra)  # type: ignore[arg-type]
        pools.append(p)
        return p

    yield build
    for p in pools:
        await close_watched(p)


CLOSE_WATCH_S = 60.0  # Pool.aclose() is bounded well below this (every wait in it is)


async def close_watched(pool: Pool) -> None:
    """``pool.aclose()``; if it has not returned after ``CLOSE_WATCH_S``, every asyncio
    task's stack goes to stderr (pytest-timeout shows threads, not coroutines) and the
    close is reported as a hang."""
    closing = asyncio.ensure_future(pool.aclose())
    done, _ = await asyncio.wait([closing], timeout=CLOSE_WATCH_S)
    if not done:
        for task in asyncio.all_tasks():
            task.print_stack(limit=15, file=sys.stderr)
        closing.cancel()
        pytest.fail(f"Pool.aclose() did not return within {CLOSE_WATCH_S:.0f} s")
    closing.result()
