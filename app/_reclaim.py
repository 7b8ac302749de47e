"""Jobs outlive their worker: a dead owner is noticed and its jobs end or run again.

Every worker sharing a coordinator heartbeats ``jobowner:<worker>`` (TTL: the lease TTL,
renewed every third of it) and indexes each job it runs under ``jobrun:<id>`` (owner,
deadline, and the body when the job can be run again). Every worker sweeps that small
index once per third of a TTL; a job is *reclaimed* when

* its owner's heartbeat is gone (the owner died, or froze, at least one TTL ago), or
* it is past its deadline by a TTL, whatever happened to its owner (``timeout_s``
  holds everywhere).

Reclaiming is a compare-and-set on the job's mirror (:meth:`SharedJobStore.claim`), so
one worker wins and an owner that wakes up finds its job taken and stops it. The
winner then:

* re-runs the job itself (same id, ``requeued`` + 1, stage ``queued`` again, so its SSE
  stream goes on with that event) when it never reached the Space (stage ``queued`` or
  ``waking``) or the caller said ``safe_to_retry``, within what is left of its deadline;
* else ends it ``failed`` with ``error: "worker_lost"`` (or ``"deadline"``) and the reason.

A job whose input files were uploaded to the lost worker cannot run again: it fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pool.admission import SharedValues

from ._boundary import Boundary
from ._files import FileOutput
from ._inputs import Call, checked_call
from ._jobs import JobRecord, JobRunner
from ._schemas import PredictRequest
from ._shared_jobs import SharedJobStore

_log = logging.getLogger("spacepool.app")
RUN = "jobrun:"  # jobrun:<job id> → owner, deadline, body of a job not yet final
OWNER = "jobowner:"  # jobowner:<worker> while that worker is alive


def _lost(reason: str) -> dict[str, Any]:
    return {"error": "worker_lost", "message": reason, "status": 502}


class Reclaimer:
    """This worker's heartbeat, its job index, and the sweep that reclaims others' jobs."""

    def __init__(
        self,
        runner: JobRunner,
        store: SharedJobStore,
        values: Callable[[], SharedValues],
        ttl_s: float,
        files_for: Callable[[PredictRequest], FileOutput],
        boundary: Boundary,
    ) -> None:
        self._boundary = boundary
        self.runner = runner
        self.store = store
        self._values = values
        self.ttl_s = ttl_s
        self._files_for = files_for
        self.worker = store.worker
        runner.on_start = self.track
        runner.on_end = self.untrack
        store.on_lost = runner.lost

    # -- this worker's jobs ----------------------------------------------------------------
    async def track(self, record: JobRecord, body: PredictRequest, call: Call) -> None:
        """Index a job this worker starts (its body too when it could run again)."""
        timeout = body.timeout_s or self.runner.settings.job_timeout_s
        rerunnable = call.folder is None and call.args == body.args and call.kwargs == body.kwargs
        info = {
            "owner": self.worker,
            "deadline": record.created_at + timeout,
            "body": body.model_dump(mode="json") if rerunnable else None,
        }
        await self._put(record.job_id, info)

    async def _put(self, job_id: str, info: dict[str, Any]) -> None:
        ttl = max(info["deadline"] - time.time(), 0.0) + 3 * self.ttl_s
        with contextlib.suppress(Exception):  # best effort, as the mirror
            await self._values().put(RUN + job_id, json.dumps(info), ttl_s=ttl)

    async def untrack(self, job_id: str) -> None:
        """The job ended here: drop it from the index (if it is still this worker's)."""
        raw = await self._values().get(RUN + job_id)
        if raw is not None and json.loads(raw).get("owner") == self.worker:
            await self._values().delete(RUN + job_id)

    # -- the loop --------------------------------------------------------------------------
    async def run(self) -> None:
        """Heartbeat and sweep every third of a TTL, until cancelled."""
        while True:
            try:
                await self._values().put(OWNER + self.worker, "1", ttl_s=self.ttl_s)
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store is away: try again next tick
                _log.warning("job reclaim sweep failed (%s)", type(exc).__name__)
            await asyncio.sleep(self.ttl_s / 3)

    async def sweep(self) -> int:
        """Reclaim every job whose owner is gone or whose deadline is long past."""
        values = self._values()
        runs = await values.scan(RUN)
        await self._fence(runs)
        if not runs:
            return 0
        owners = await values.scan(OWNER)
        now = time.time()
        taken = 0
        for key, raw in runs.items():
            info = json.loads(raw)
            overdue = now > float(info["deadline"]) + self.ttl_s
            if info["owner"] == self.worker and not overdue:
                continue
            if OWNER + str(info["owner"]) in owners and not overdue:
                continue
            taken += await self._take(key[len(RUN) :], info, overdue)
        return taken

    async def _fence(self, runs: dict[str, str]) -> None:
        """Stop this worker's jobs that another worker took over (it was frozen)."""
        for job_id in self.runner.running():
            raw = runs.get(RUN + job_id)
            if raw is not None and json.loads(raw).get("owner") == self.worker:
                continue
            record = await self.store.remote(job_id)
            if raw is None and (record is None or record.owner in (None, self.worker)):
                continue  # not indexed (the store was away): the mirror says it is ours
            _log.warning("job taken over by another worker", extra={"job_id": job_id})
            self.store.local.forget(job_id)
            self.runner.lost(job_id)

    async def _take(self, job_id: str, info: dict[str, Any], overdue: bool) -> int:
        record = await self.store.remote(job_id)
        if record is None or record.final:
            with contextlib.suppress(Exception):
                await self._values().delete(RUN + job_id)
            return 0
        if record.owner != info["owner"] and not overdue:
            return 0  # another worker took it a moment ago (its index entry follows)
        left = float(info["deadline"]) - time.time()
        body = info.get("body")
        retry = record.stage in ("queued", "waking") or bool(body and body["safe_to_retry"])
        base: dict[str, Any] = {
            "version": record.version + 1,
            "updated_at": time.time(),
            "owner": self.worker,
        }
        if overdue or left < 1.0:
            error = {"error": "deadline", "message": "the job's deadline passed", "status": 504}
            new = replace(record, **base, stage="failed", error=error)
        elif retry and body is not None:
            new = replace(
                record, **base, stage="queued", requeued=(record.requeued or 0) + 1,
                space=None, queue_position=None, estimate_s=None, partial=None,
                partial_index=None, upstream_rank=None, upstream_eta_s=None, progress=None,
            )  # fmt: skip
        else:
            reason = (
                "its input files were on the lost worker"
                if retry
                else "the worker running it was lost after the Space accepted the call"
                " (not safe_to_retry)"
            )
            new = replace(record, **base, stage="failed", error=_lost(reason))
        if not await self.store.claim(job_id, record.owner, new):
            return 0  # another worker was faster
        _log.warning(
            "job reclaimed from a lost worker",
            extra={"job_id": job_id, "stage": new.stage, "requeued": new.requeued},
        )
        if new.final:
            with contextlib.suppress(Exception):
                await self._values().delete(RUN + job_id)
            return 1
        await self._resume(new, PredictRequest.model_validate(body), left, info)
        return 1

    async def _resume(
        self, record: JobRecord, body: PredictRequest, left: float, info: dict[str, Any]
    ) -> None:
        """Run the job here, in what is left of its deadline."""
        await self._put(record.job_id, {**info, "owner": self.worker})
        await self.store.local.add(record)
        body = body.model_copy(update={"timeout_s": left})
        call = checked_call(body, self._boundary)
        self.runner.start(record.job_id, body, call, self._files_for(body))
