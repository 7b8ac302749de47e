"""Jobs: long predicts run in the background and followed by polling or SSE.

Two parts, kept apart so that a later change can move jobs into the shared
coordinator store (readable from every worker) without touching the runner or the API:

* :class:`JobStore` — the tiny interface: ``add``, ``get``, ``update``, ``changes``,
  ``counts``. :class:`MemoryJobStore` is the in-process one: one dict, a short history of
  views per job (so that SSE sends one event per change), retention of finished jobs for
  ``POOL_JOB_RETENTION_S`` and at most ``POOL_JOB_MAX`` jobs in all.
* :class:`JobRunner` — runs each job as an asyncio task of the worker that accepted it,
  using the pool exactly as a handler would (``get_pool().client(...)`` then
  ``predict``). The task never depends on the HTTP connection that created it.
  ``cancel`` cancels the task: the pool cancels the upstream job and frees the slot
  on the way out. A generator endpoint's partial outputs become new versions of the
  job (``partial``, ``partial_index``, stage ``running``), so its SSE stream sends one
  event per partial, then the final result.

Stages (``GET /api/jobs/{id}``)::

    queued ◄─► waking
       │          │
       └──────────┴──► running ──► done
                          ├──────► failed      (error: the same JSON as the HTTP error)
       (any stage) ───────┴──────► cancelled   (DELETE, or the service shutting down)

``waking``: the job's Space is asleep and the pool is waiting for it to start (within
its wake deadline; ``space`` names it). A final stage is sticky: later updates are
ignored, which settles a cancel racing a finish.

With the in-process store a job is visible only in the worker that created it; with
a shared one (:mod:`app.jobs._shared`) every worker reads and cancels it, and a job's
changes reach another worker's watchers as they happen (signalled, not polled).

**Per user.** One email (every anonymous caller together counting as one) has at most
``POOL_MAX_QUEUED_JOBS_PER_USER`` jobs not yet final: the runner counts them in the
coordinator's shared values (``jobs-held:<user>``, :mod:`pool._holdings`), so the bound
holds exactly across every worker and host sharing it, whichever job store. Beyond it,
``submit`` raises :class:`~pool.UserLimitReached` (429 ``too_many_jobs``) before the job
is recorded. A job leaves the count when it ends on its worker; one whose worker died
leaves it when its owner is next at the limit and its record is found final or gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Callable
from typing import Any

from pool import Holdings, Partial, WaitTicket, get_pool
from pool.admission import SharedValues
from pool.admission import current as current_consumer

from ..calls import CheckedCall, UpstreamView
from ..core import MAX_TIMEOUT_S, ServiceSettings, describe
from ..edge import FileOutput, PredictRequest, pass_gate, to_jsonable
from ._store import JobRecord, JobStore

_log = logging.getLogger("spacepool.app")
_REMOTE_CANCEL_S = 0.8  # a DELETE waits this long for another worker to cancel its job
_CANCELLED = {"error": "cancelled", "message": "cancelled"}
_HELD = "jobs-held:"  # jobs-held:<user> → their jobs not yet final (pool/_holdings.py)
_STARTING_S = 30.0  # a job counted but not in the store yet: being submitted


class JobRunner:
    """Starts, follows and cancels this worker's jobs."""

    def __init__(
        self,
        store: JobStore,
        settings: ServiceSettings,
        owner: str | None = None,
        values: Callable[[], SharedValues] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.owner = owner  # this worker's id in a shared store's job mirrors
        # Jobs per user, counted in ``values`` (the coordinator's); None: not bounded.
        self.held = None if values is None else Holdings(
            values, _HELD, what="jobs", ttl_s=2 * MAX_TIMEOUT_S, grace_s=_STARTING_S,
            clock=time.time,
        )  # fmt: skip
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closing = False

    async def submit(
        self,
        body: PredictRequest,
        call: CheckedCall,
        files: FileOutput | None = None,
        job_id: str | None = None,
    ) -> JobRecord:
        """Record the job as queued and start its task; returns at once.

        ``call``: the body's arguments with file arguments on disk (deleted when the
        job ends); ``files``: where output files go and how they are rendered.
        """
        now = time.time()
        consumer = current_consumer()  # a reclaimed job runs for its key again
        record = JobRecord(
            job_id or secrets.token_urlsafe(16),
            "queued",
            created_at=now,
            updated_at=now,
            owner=self.owner,
            team=None if consumer is None else consumer.key_id,
        )
        user = get_pool().hash_user(body.email)
        if self.held is not None:
            limit = self.settings.max_queued_jobs_per_user
            await self.held.take(user, record.job_id, limit, self._lasts)
        try:
            await self.store.add(record)
        except BaseException:
            await self._release(user, record.job_id)
            raise
        timeout = body.timeout_s or self.settings.job_timeout_s
        rerunnable = call.folder is None and call.args == body.args and call.kwargs == body.kwargs
        await self.store.track(
            record.job_id, record.created_at + timeout,
            body.model_dump(mode="json") if rerunnable else None,
            None if consumer is None else consumer.key_id,
        )  # fmt: skip
        self.start(record.job_id, body, call, files)
        return record

    def start(
        self, job_id: str, body: PredictRequest, call: CheckedCall, files: FileOutput | None
    ) -> None:
        """Run the job ``job_id`` (already in the store) as a task of this worker."""
        task = asyncio.get_running_loop().create_task(
            self._run(job_id, body, call, files), name=f"job-{job_id[:8]}"
        )
        self._tasks[job_id] = task
        stopper = asyncio.get_running_loop().create_task(
            self._stop_when_told(job_id, task), name=f"job-{job_id[:8]}-stop"
        )

        def ended(_: asyncio.Task[None]) -> None:
            self._tasks.pop(job_id, None)
            stopper.cancel()

        task.add_done_callback(ended)

    async def _stop_when_told(self, job_id: str, task: asyncio.Task[None]) -> None:
        """Cancel the job's task when another worker asks to, or takes the job over
        (then it stops without a word: the record is that worker's now)."""
        try:
            why = await self.store.stopped(job_id)
        except Exception as exc:  # not watched any more: the job runs on regardless
            _log.warning("cannot watch job %s (%s)", job_id[:8], type(exc).__name__)
            return
        if why == "lost":
            _log.warning("job taken over by another worker", extra={"job_id": job_id})
        task.cancel()

    async def _lasts(self, job_id: str) -> float | None:
        """None when the job ended (final, or gone from the store); else unknown."""
        record = await self.store.get(job_id)
        return None if record is None or record.final else math.inf

    async def _release(self, user: str | None, job_id: str) -> None:
        """The job no longer counts for its user (a store outage: counted until found
        ended, the next time the user is at the limit)."""
        if self.held is not None:
            with contextlib.suppress(Exception):
                await self.held.drop(user, job_id)

    async def cancel(self, job_id: str) -> JobRecord | None:
        """Cancel the job (upstream too) and wait until its slot is given back.

        A job running on another worker is asked to stop through the shared store;
        this waits (bounded) until that worker reports a final stage.
        """
        task = self._tasks.get(job_id)
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=10.0)
        elif await self.store.request_cancel(job_id):
            # Its owner answers at once (it watches the request); one that does not
            # (dead, frozen) is overruled: the job is settled here and the owner, if it
            # wakes, finds it taken (app/jobs/_shared.py) and stops.
            record = await self._until_final(job_id, _REMOTE_CANCEL_S)
            if record is None or record.final:
                return record
            return await self.store.settle(job_id, stage="cancelled", error=_CANCELLED)
        await self.store.update(job_id, stage="cancelled", error=_CANCELLED)
        return await self.store.get(job_id)

    async def _until_final(self, job_id: str, within_s: float) -> JobRecord | None:
        """The job's record once final (or gone), else as it is after ``within_s``."""
        deadline = time.monotonic() + within_s
        while (record := await self.store.get(job_id)) is not None and not record.final:
            left = deadline - time.monotonic()
            if left <= 0 or await self.store.changes(job_id, record.version, left) is None:
                break
        return await self.store.get(job_id)

    async def aclose(self) -> None:
        """Cancel every job still running (the service is stopping)."""
        self._closing = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=10.0)

    async def _run(
        self, job_id: str, body: PredictRequest, call: CheckedCall, files: FileOutput | None
    ) -> None:
        try:
            await self._run_call(job_id, body, call, files)
        finally:
            call.cleanup()
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.untrack(job_id))
            with contextlib.suppress(Exception):
                await asyncio.shield(self._ended(job_id, body))

    async def _ended(self, job_id: str, body: PredictRequest) -> None:
        """The task ended: the job stops counting for its user once it is final (a
        job another worker took over runs on there, and counts on)."""
        record = await self.store.get(job_id)
        if record is None or record.final:
            await self._release(get_pool().hash_user(body.email), job_id)

    async def _run_call(
        self, job_id: str, body: PredictRequest, call: CheckedCall, files: FileOutput | None
    ) -> None:
        s = self.settings
        started = time.monotonic()
        timeout = body.timeout_s or s.job_timeout_s
        ticket = WaitTicket()
        follower = asyncio.get_running_loop().create_task(_follow_queue(self.store, job_id, ticket))
        try:
            pool = get_pool()

            async def admitted(space: str) -> None:
                follower.cancel()
                await pass_gate(space)  # its key revoked, or out of Space-seconds: not run
                record = await self.store.update(
                    job_id,
                    stage="running",
                    space=space,
                    queue_position=None,
                    estimate_s=None,
                    queued_ms=round((time.monotonic() - started) * 1000, 1),
                )
                if record is not None and record.owner != self.owner:
                    raise asyncio.CancelledError  # taken over: never send it (app/jobs/_reclaim.py)

            async def partial(p: Partial) -> None:
                await self.store.update(
                    job_id,
                    partial=to_jsonable(p.output, files.render if files is not None else None),
                    partial_index=p.index,
                )

            async def show(changed: dict[str, Any]) -> None:
                await self.store.update(job_id, **changed)

            upstream = UpstreamView(show)

            try:
                done = await call.predict(
                    pool,
                    timeout=timeout,
                    queue_timeout_s=min(s.job_queue_timeout_s, timeout),
                    ticket=ticket,
                    on_admitted=admitted,
                    on_partial=partial,
                    download_to=files.store.partial if files is not None else None,
                    on_event=upstream,
                )
            finally:
                upstream.close()
                follower.cancel()
                call.cleanup()  # the Space has the files by now
            await self.store.update(
                job_id,
                stage="done",
                space=done.space,
                result=to_jsonable(done.result, files.render if files is not None else None),
                duration_ms=done.duration_ms,
            )
        except asyncio.CancelledError:
            reason = "the service is shutting down" if self._closing else "cancelled"
            await self.store.update(
                job_id, stage="cancelled", error={"error": "cancelled", "message": reason}
            )
            raise
        except Exception as exc:
            problem = describe(exc)
            if problem.body.get("error") == "internal":
                _log.error("job failed unexpectedly", exc_info=exc, extra={"job_id": job_id})
            await self.store.update(
                job_id, stage="failed", error={**problem.body, "status": problem.status}
            )


async def _follow_queue(store: JobStore, job_id: str, ticket: WaitTicket) -> None:
    """Until admitted (this task is cancelled then): copy the ticket's stage (queued
    or waking), Space, position and estimate into the job at each of its changes."""
    seen: tuple[str, int, int] | None = None
    stage = "queued"
    while True:
        position = ticket.position
        estimate = round(ticket.estimate_s, 1) if position else None
        key = (ticket.stage, position, round(estimate or 0))
        if key != seen:
            seen = key
            changes: dict[str, Any] = {
                "queue_position": position or None,
                "estimate_s": estimate,
            }
            if ticket.stage != stage:
                changes.update(stage=ticket.stage, space=ticket.space)
            record = await store.update(job_id, expect_stage=stage, **changes)
            if record is None or record.stage not in ("queued", "waking"):
                return  # admitted (running) or gone: nothing more to follow
            stage = record.stage
        await ticket.changed()
