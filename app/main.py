"""spacepool's HTTP service: ``app`` is the FastAPI application uvicorn serves.

    uvicorn app.main:app --host 0.0.0.0 --port 7860 --workers 2
    python -m app                      # local demo: starts stand-in Spaces too

The lifespan owns the pool: it takes the process-wide pool (``pool.get_pool()``, built
from ``POOL_*`` settings; no Space is contacted until the first request), subscribes
the metrics to its hooks, runs the job runner, and on shutdown cancels running jobs
and closes the pool (every connection and lease): once shutdown returns, the process
has the threads and file descriptors it had before the pool was first used.

Behind this module, one concept each:

* :mod:`app.api._predict` — the endpoints, happy paths only;
* :mod:`app.core._errors` — every error mapped to a status code, in one place;
* :mod:`app.edge._auth` — bearer tokens and API keys, the one boundary of both faces;
  :mod:`app.teams._keys` — API keys (consumers with limits); :mod:`app.teams._usage` — usage per
  key and user, daily quotas; :mod:`app.admin._teams` — ``/api/admin/keys``, ``/usage``;
* :mod:`app.edge._schemas` — bodies and limits;
* :mod:`app.jobs._runner` — background jobs behind a small store interface;
  :mod:`app.jobs._shared` and :mod:`app.jobs._reclaim` — jobs every worker reads, and
  reclaims from a lost worker;
* :mod:`app.calls._inputs` — request bodies, JSON or multipart, and file arguments;
* :mod:`app.edge._files` — output files: the download folder, ``/api/files/{token}``;
* :mod:`app.api._spaces` — discovery: ``/api/spaces``, ``/api/spaces/{name}/api``;
* :mod:`app.api._sessions` — ``/api/sessions``: conversations that keep a Space's state;
* :mod:`app.api._streaming` — ``POST /api/predict`` answered as Server-Sent Events;
* :mod:`app.core._metrics` — Prometheus; :mod:`app.core._logging` — JSON access log;
* :mod:`app.core._limits` — request body size cap; :mod:`app.core._settings` — the knobs;
* :mod:`app.gradio` — ``/gradio/{alias}/`` and ``/gradio/``: the Gradio API itself;
* :mod:`app.admin._dashboard` — ``GET /admin``, the page; :mod:`app.admin._history` — the rolling
  activity (requests per minute, error classes, queue history) it and pool-stats show.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
from collections.abc import AsyncIterator
from importlib import metadata

from fastapi import FastAPI
from pydantic import ValidationError

from pool import Pool, get_pool
from pool._tasks import cancel_and_wait
from pool.admission import SharedValues

from .admin import Activity, Readiness, dashboard_router, run_sampler
from .admin import teams_router as team_router
from .api import predict_router as router
from .api import sessions_router, spaces_router
from .core import (
    AccessLog,
    BodySizeLimit,
    Draining,
    ServiceSettings,
    StreamCaps,
    TraceRequests,
    configure_logging,
    on_pool_event,
    outbound_port_problem,
)
from .core import errors as _errors
from .core import startup as _startup
from .core import tracing as _tracing
from .edge import (
    Boundary,
    FileOutput,
    FileStore,
    PredictRequest,
    files_router,
    gate_of,
    run_sweeper,
)
from .gradio import FrontSessions
from .gradio import event_of as gradio_event_of
from .gradio import router as gradio_router
from .jobs import JobRunner, MemoryJobStore, Reclaimer, SharedJobStore
from .teams import Keys, Usage

_log = logging.getLogger("spacepool.app")


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: ServiceSettings = app.state.settings
    configure_logging()
    if not _startup.CHECKED:  # python -m app checked them before its banner
        problems, warnings = _startup.check_environment(os.environ)
        for line in warnings:
            _log.warning(line)
        if problems:
            for line in problems:
                _log.error(line)
            raise RuntimeError(f"{len(problems)} setting(s) malformed (logged above)")
    tracing = _tracing.configure()  # OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set
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
    try:
        pool = get_pool()
        await pool.start()
    except Exception as exc:
        down = await _startup.coordinator_problem(os.environ.get("POOL_COORDINATOR_URL", ""))
        _log.error(down or f"cannot start the pool ({type(exc).__name__}): {exc}")
        if down is not None:  # a configuration problem, not a busy service: say only that
            raise RuntimeError(down) from None
        raise
    pool.hooks.append(on_pool_event)
    activity = Activity()
    pool.hooks.append(activity.on_event)
    app.state.activity = activity
    keys = app.state.keys = Keys(lambda: pool.coordinator.values)
    await keys.start()
    usage = app.state.usage = Usage(lambda: pool.coordinator.values)
    app.state.streams = StreamCaps(settings.max_streams_per_caller)  # app/core/_streams.py
    pool.hooks.append(usage.on_event)
    usage.start()
    readiness = app.state.readiness = Readiness()
    sampler = asyncio.get_running_loop().create_task(run_sampler(activity, pool))
    local = MemoryJobStore(
        retention_s=settings.job_retention_s,
        max_jobs=settings.job_max,
        history=pool.settings.stream_keep,
    )
    files = FileStore(
        settings.file_dir,
        ttl_s=settings.file_ttl_s,
        max_total_bytes=settings.file_max_total_bytes,
    )
    app.state.files = files
    boundary = app.state.boundary = Boundary(
        files, allow_urls=settings.allow_file_urls, outputs_ttl_s=settings.file_ttl_s
    )
    runner, reclaim = _job_runner(local, pool, settings, files, boundary, keys, usage)
    app.state.jobs = runner
    sweeper = asyncio.get_running_loop().create_task(run_sweeper(files))
    draining = Draining()  # set by a stop signal: the streams that never end end
    front = app.state.gradio_sessions = FrontSessions(
        settings.gradio_session_idle_s,
        max_sessions=settings.gradio_max_sessions,
        max_per_user=settings.gradio_max_sessions_per_user,
        # Each running event holds one of a Space's connections: at most half of them
        # run front events, the rest stay for the JSON API.
        max_upstream=max(1, pool.settings.max_connections // 2),
        max_queued=settings.gradio_queue_max_size,
        boundary=boundary,
        pool=pool,
        event_of=gradio_event_of,
        draining=draining,
    )
    front.gate_of = functools.partial(gate_of, keys, usage)  # a handed-over event's key
    draining.install()
    space_probe = asyncio.get_running_loop().create_task(_startup.probe_spaces(pool))
    _log.info(
        "serving %d Space(s): %s; admission store %s",
        len(pool.spaces),
        ", ".join(pool.spaces),
        pool.coordinator.store,
    )
    try:
        yield
    finally:
        draining.uninstall()
        await cancel_and_wait(space_probe)
        reclaim.cancel()
        await front.aclose()  # Gradio sessions: their events' slots freed
        sweeper.cancel()
        await files.aclose()
        await cancel_and_wait(reclaim, sampler)  # ended before the pool closes
        await runner.aclose()
        await keys.aclose()
        await usage.aclose()  # the last figures written
        await readiness.aclose()
        for hook in (on_pool_event, activity.on_event, usage.on_event):
            with contextlib.suppress(ValueError):
                pool.hooks.remove(hook)
        await pool.aclose()
        _tracing.shutdown(tracing)


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
    app.state.settings = settings
    _errors.install(app)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        multipart_max_bytes=settings.max_body_bytes + settings.max_upload_bytes,
    )
    app.add_middleware(TraceRequests)  # one span per request (app/core/_tracing.py)
    app.add_middleware(AccessLog, internal_error=_errors.internal_error)  # outermost
    app.include_router(router)
    app.include_router(files_router)
    app.include_router(spaces_router)
    app.include_router(sessions_router)
    app.include_router(dashboard_router)
    app.include_router(team_router)
    app.include_router(gradio_router)
    return app


app = create_app()
