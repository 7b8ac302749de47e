"""spacepool's HTTP service: ``app`` is the FastAPI application uvicorn serves.

    uvicorn app.main:app --host 0.0.0.0 --port 7860 --workers 2
    python -m app                      # local demo: starts stand-in Spaces too

The lifespan owns the pool: it takes the process-wide pool (``pool.get_pool()``, built
from ``POOL_*`` settings; no Space is contacted until the first request), subscribes
the metrics to its hooks, runs the job runner, and on shutdown cancels running jobs
and closes the pool (every connection and lease): once shutdown returns, the process
has the threads and file descriptors it had before the pool was first used.

This module is wiring only: it builds the parts and hands them to the routes through
the app's typed :class:`~app.core.Services`. The parts live in folders by face, each
folder's ``__init__`` its face (docs/architecture.md):

* :mod:`app.core` — settings, errors answered by exception class, the JSON access log,
  metrics, tracing, draining, the body cap, the checks at start, the services;
* :mod:`app.teams` — API keys (consumers with limits) and usage per key and user;
* :mod:`app.edge` — the one trust boundary both faces use: tokens and keys, the
  boundary's checks of values and files, bodies, the output-file store;
* :mod:`app.calls` — a call's body read and checked, its progress;
* :mod:`app.jobs` — background jobs, shared between workers, reclaimed, idempotent;
* :mod:`app.api` — the JSON API: predict, jobs, files, discovery, sessions;
* :mod:`app.admin` — operations (probes, pool-stats, metrics), the dashboard, API keys;
* :mod:`app.gradio` — ``/gradio/{alias}/`` and ``/gradio/``: the Gradio API itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from importlib import metadata

from fastapi import FastAPI
from opentelemetry.trace import TracerProvider
from pydantic import ValidationError

from pool import Pool, cancel_and_wait, get_pool
from pool.admission import SharedValues

from .admin import Activity, Readiness, dashboard_router, ops_router, run_sampler
from .admin import teams_router as team_router
from .api import files_router, jobs_router, predict_router, sessions_router, spaces_router
from .core import (
    AccessLog,
    BodySizeLimit,
    Draining,
    Services,
    ServiceSettings,
    StreamCaps,
    TraceRequests,
    configure_logging,
    on_pool_event,
    outbound_port_problem,
    services_of,
)
from .core import errors as _errors
from .core import startup as _startup
from .core import tracing as _tracing
from .edge import (
    Boundary,
    FileOutput,
    FileStore,
    PredictRequest,
    gate_of,
    run_sweeper,
)
from .gradio import FrontCors, FrontSessions
from .gradio import pages_router as gradio_pages_router
from .gradio import router as gradio_router
from .jobs import JobRunner, MemoryJobStore, Reclaimer, SharedJobStore
from .teams import Keys, Usage

_log = logging.getLogger("spacepool.app")


def _check_settings(settings: ServiceSettings) -> None:
    """The environment checked (unless ``python -m app`` did before its banner), then the
    warnings about what the settings leave open."""
    if not _startup.CHECKED:
        problems, warnings = _startup.check_environment(os.environ)
        for line in warnings:
            _log.warning(line)
        if problems:
            for line in problems:
                _log.error(line)
            raise RuntimeError(f"{len(problems)} setting(s) malformed (logged above)")
    if settings.admin_token is None:
        _log.warning("POOL_ADMIN_TOKEN is not set: every /api/admin/* request is refused")
    if settings.api_token is None:
        _log.info("POOL_API_TOKEN is not set: /api/predict and /api/jobs are open")
    if os.environ.get("SPACE_ID"):  # running as a Hub Space: only 80/443/8080 go out
        problem = outbound_port_problem(os.environ.get("POOL_COORDINATOR_URL", ""))
        if problem is not None:
            _log.warning(problem)
    if settings.gradio_queue_wait_s is not None:
        _log.warning("POOL_GRADIO_QUEUE_WAIT_S is obsolete and ignored: Gradio front joins are"
                     " answered at once, their events wait up to POOL_QUEUE_TIMEOUT_S")  # fmt: skip


async def _start_pool() -> Pool:
    """The process-wide pool, started; a store that cannot be reached is one clear line."""
    try:
        pool = get_pool()
        await pool.start()
    except Exception as exc:
        down = await _startup.coordinator_problem(os.environ.get("POOL_COORDINATOR_URL", ""))
        _log.error(down or f"cannot start the pool ({type(exc).__name__}): {exc}")
        if down is not None:  # a configuration problem, not a busy service: say only that
            raise RuntimeError(down) from None
        raise
    return pool


async def _start_teams(pool: Pool, services: Services) -> tuple[Activity, Keys, Usage]:
    """The pool's observers (metrics, the dashboard's activity, usage) and the key store."""
    pool.hooks.append(on_pool_event)
    activity = services.provide(Activity())
    pool.hooks.append(activity.on_event)
    keys = services.provide(Keys(lambda: pool.coordinator.values))
    await keys.start()
    usage = services.provide(Usage(lambda: pool.coordinator.values))
    services.provide(StreamCaps(services.settings.max_streams_per_caller))
    pool.hooks.append(usage.on_event)
    usage.start()
    return activity, keys, usage


def _start_files(settings: ServiceSettings, services: Services) -> tuple[FileStore, Boundary]:
    """The output-file store and the trust boundary that checks every file and value."""
    files = services.provide(FileStore(
        settings.file_dir,
        ttl_s=settings.file_ttl_s,
        max_total_bytes=settings.file_max_total_bytes,
    ))  # fmt: skip
    boundary = services.provide(Boundary(
        files, allow_urls=settings.allow_file_urls, outputs_ttl_s=settings.file_ttl_s
    ))  # fmt: skip
    return files, boundary


def _start_front(pool: Pool, services: Services, draining: Draining) -> FrontSessions:
    """The Gradio front's sessions."""
    settings = services.settings
    front = services.provide(FrontSessions(
        settings.gradio_session_idle_s,
        max_sessions=settings.gradio_max_sessions,
        max_per_user=settings.gradio_max_sessions_per_user,
        # Each running event holds one of a Space's connections: at most half of them
        # run front events, the rest stay for the JSON API.
        max_upstream=max(1, pool.settings.max_connections // 2),
        max_queued=settings.gradio_queue_max_size,
        boundary=services.get(Boundary),
        pool=pool,
        draining=draining,
    ))  # fmt: skip
    front.gate_of = functools.partial(gate_of, services.get(Keys), services.get(Usage))
    return front


@dataclass
class _Running:
    """What the lifespan started; :meth:`stop` ends it in this order."""

    pool: Pool
    activity: Activity
    keys: Keys
    usage: Usage
    readiness: Readiness
    files: FileStore
    runner: JobRunner
    front: FrontSessions
    draining: Draining
    tracing: TracerProvider | None
    sampler: asyncio.Task[None]
    reclaim: asyncio.Task[None]
    sweeper: asyncio.Task[None]
    space_probe: asyncio.Task[dict[str, str]]

    async def stop(self) -> None:
        self.draining.uninstall()
        await cancel_and_wait(self.space_probe)
        self.reclaim.cancel()
        await self.front.aclose()  # Gradio sessions: their events' slots freed
        self.sweeper.cancel()
        await self.files.aclose()
        await cancel_and_wait(self.reclaim, self.sampler)  # ended before the pool closes
        await self.runner.aclose()
        await self.keys.aclose()
        await self.usage.aclose()  # the last figures written
        await self.readiness.aclose()
        for hook in (on_pool_event, self.activity.on_event, self.usage.on_event):
            with contextlib.suppress(ValueError):
                self.pool.hooks.remove(hook)
        await self.pool.aclose()
        _tracing.shutdown(self.tracing)


async def _start(services: Services) -> _Running:
    """Every part, in order: the settings checked, tracing, the pool, its observers and
    keys, readiness, the files and boundary, the jobs, the Gradio front, draining."""
    settings = services.settings
    configure_logging()
    _check_settings(settings)
    tracing = _tracing.configure()  # OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set
    pool = await _start_pool()
    activity, keys, usage = await _start_teams(pool, services)
    readiness = services.provide(Readiness())
    loop = asyncio.get_running_loop()
    sampler = loop.create_task(run_sampler(activity, pool))
    local = MemoryJobStore(
        retention_s=settings.job_retention_s,
        max_jobs=settings.job_max,
        history=pool.settings.stream_keep,
    )
    files, boundary = _start_files(settings, services)
    runner, reclaim = _job_runner(local, pool, settings, files, boundary, keys, usage)
    services.provide(runner)
    sweeper = loop.create_task(run_sweeper(files))
    draining = Draining()  # set by a stop signal: the streams that never end end
    front = _start_front(pool, services, draining)
    draining.install()
    space_probe = loop.create_task(_startup.probe_spaces(pool))
    _log.info(
        "serving %d Space(s): %s; admission store %s",
        len(pool.spaces),
        ", ".join(pool.spaces),
        pool.coordinator.store,
    )
    return _Running(pool, activity, keys, usage, readiness, files, runner, front, draining,
                    tracing, sampler, reclaim, sweeper, space_probe)  # fmt: skip


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    running = await _start(services_of(app))
    try:
        yield
    finally:
        await running.stop()


async def _idle() -> None:
    await asyncio.Event().wait()


def _job_runner(
    local: MemoryJobStore, pool: Pool, settings: ServiceSettings, files: FileStore,
    boundary: Boundary, keys: Keys, usage: Usage,
) -> tuple[JobRunner, asyncio.Task[None]]:  # fmt: skip
    """The job runner; with a shared coordinator, jobs every worker reads, cancels and
    reclaims from a lost worker (app.jobs._reclaim), and the task that heartbeats for it."""

    def values() -> SharedValues:  # where each user's jobs are counted (app/jobs/_runner.py)
        return pool.coordinator.values

    if pool.coordinator.store == "memory":
        runner = JobRunner(local, settings, values=values)
        return runner, asyncio.get_running_loop().create_task(_idle())
    store = SharedJobStore(local, values, settings.job_retention_s, pool.settings.lease_ttl_s)
    runner = JobRunner(store, settings, owner=store.worker, values=values)

    def files_for(body: PredictRequest) -> FileOutput:
        return FileOutput(files, body.files, settings.file_inline_max_bytes)

    reclaimer = Reclaimer(
        runner, store, lambda: pool.coordinator.values, pool.settings.lease_ttl_s, files_for,
        boundary, keys, functools.partial(gate_of, keys, usage),
    )  # fmt: skip
    return runner, asyncio.get_running_loop().create_task(reclaimer.run())


def _version() -> str:
    try:
        return metadata.version("spacepool")
    except metadata.PackageNotFoundError:
        return "0"


def _settings_or_exit() -> ServiceSettings:
    """The service's settings from the environment; malformed, one line each on stderr
    and exit 2 (``uvicorn app.main:app`` imports this module: no traceback for a typo)."""
    try:
        return ServiceSettings()
    except ValidationError:
        problems, _ = _startup.check_environment(os.environ)
        for line in problems or ["the POOL_* settings are malformed"]:
            print(f"spacepool: error: {line}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    """A new application; ``settings`` default to the ``POOL_*`` environment."""
    settings = settings or _settings_or_exit()
    app = FastAPI(
        title="spacepool",
        version=_version(),
        description="Warm, admission-controlled access to Gradio Spaces.",
        lifespan=_lifespan,
    )
    app.state.services = Services(settings)
    _errors.install(app)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        multipart_max_bytes=settings.max_body_bytes + settings.max_upload_bytes,
    )
    app.add_middleware(TraceRequests)  # one span per request (app/core/_tracing.py)
    app.add_middleware(FrontCors, settings=settings)  # /gradio/ only (app/gradio/_cors.py)
    app.add_middleware(AccessLog, internal_error=_errors.internal_error)  # outermost
    app.include_router(ops_router)
    app.include_router(predict_router)
    app.include_router(jobs_router)
    app.include_router(files_router)
    app.include_router(spaces_router)
    app.include_router(sessions_router)
    app.include_router(dashboard_router)
    app.include_router(team_router)
    app.include_router(gradio_router)
    app.include_router(gradio_pages_router)  # after the API's routes: /gradio/{alias} last
    return app


app = create_app()
