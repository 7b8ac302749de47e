"""Jobs outlive their worker: a dead owner is noticed and its jobs end or run again.

Jobs are owned records (:mod:`pool.admission._ownership`, the mechanism admission's
leases follow too). Every worker sharing a coordinator heartbeats ``jobowner:<worker>``
(TTL: the lease TTL, renewed every third of it: :class:`~pool.admission._ownership.Heartbeat`)
and indexes each job it runs under ``jobrun:<id>`` (:meth:`SharedJobStore.track`:
owner, deadline, and the body when the job can be run again). At each heartbeat a
worker sweeps that small index; a job is *reclaimed* when

* its owner's heartbeat is gone (the owner died, or froze, at least one TTL ago), or
* it is past its deadline by a TTL, whatever happened to its owner (``timeout_s``
  holds everywhere).

Reclaiming is a fenced compare-and-set on the job's mirror that raises its token
(:meth:`SharedJobStore.claim`), so one worker wins; the owner, if alive, sees the
mirror change (it watches it: :meth:`SharedJobStore.stopped`) and stops the job, and
an owner that wakes up from a freeze finds its next write refused. The winner then:

* re-runs the job itself (same id, ``requeued`` + 1, stage ``queued`` again, so its SSE
  stream goes on with that event) when it never reached the Space (stage ``queued`` or
  ``waking``) or the caller said ``safe_to_retry``, within what is left of its deadline;
* else ends it ``failed`` with ``error: "worker_lost"`` (or ``"deadline"``) and the reason.

A job whose input files were uploaded to the lost worker cannot run again: it fails.
A job made with an API key runs again as that key's (its limit, its users, its usage:
app/teams/_keys.py); one whose key was revoked meanwhile fails (``key_revoked``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from pool import get_pool
from pool.admission import CURRENT, Heartbeat, Holder, Owners, SharedValues, reclaimable

from ..calls import checked_call
from ..core import RequestContext
from ..edge import GATE, Boundary, FileOutput, Gate, PredictRequest
from ..teams import METER, KeyRecord, Keys, Meter
from ._runner import JobRunner
from ._shared import SharedJobStore
from ._store import JobRecord

_log = logging.getLogger("spacepool.app")
OWNER = "jobowner:"  # jobowner:<worker> while that worker is alive


def _lost(reason: str) -> dict[str, Any]:
    return {"error": "worker_lost", "message": reason, "status": 502}


class Reclaimer:
    """This worker's heartbeat and the sweep that reclaims other workers' jobs."""

    def __init__(
        self,
        runner: JobRunner,
        store: SharedJobStore,
        values: Callable[[], SharedValues],
        ttl_s: float,
        files_for: Callable[[PredictRequest], FileOutput],
        boundary: Boundary,
        keys: Keys | None = None,
        gate_of: Callable[[str], Gate] | None = None,
    ) -> None:
        self._boundary = boundary
        self._keys = keys
        self._gate_of = gate_of  # a key's gate (app/edge/_auth.py): revoked, out of quota
        self.runner = runner
        self.store = store
        self.ttl_s = ttl_s
        self._files_for = files_for
        self.worker = store.worker
        self.owners = Owners(values, OWNER, self.worker, ttl_s)

    async def run(self) -> None:
        """Heartbeat and sweep every third of a TTL, until cancelled."""

        def failed(exc: Exception) -> None:  # the store is away: again at the next beat
            _log.warning("job reclaim sweep failed (%s)", type(exc).__name__)

        await Heartbeat(self.ttl_s).run(self._beat, failed=failed, first_now=True)

    async def _beat(self) -> None:
        await self.owners.beat()
        await self.sweep()

    async def sweep(self) -> int:
        """Reclaim every job whose owner is gone or whose deadline is long past."""
        runs = await self.store.runs()
        if not runs:
            return 0
        alive = await self.owners.alive()
        now = time.time()
        taken = 0
        for job_id, info in runs.items():
            take, overdue = reclaimable(
                str(info["owner"]), float(info["deadline"]), me=self.worker, alive=alive,
                ttl_s=self.ttl_s, now=now,
            )  # fmt: skip
            if take:
                taken += await self._take(job_id, info, overdue)
        return taken

    async def _take(self, job_id: str, info: dict[str, Any], overdue: bool) -> int:
        record = await self.store.remote(job_id)
        if record is None or record.final:
            await self.store.forget_run(job_id)
            return 0
        if record.owner != info["owner"] and not overdue:
            return 0  # another worker took it a moment ago (its index entry follows)
        left = float(info["deadline"]) - time.time()
        body = info.get("body")
        retry = record.stage in ("queued", "waking") or bool(body and body["safe_to_retry"])
        key_id = info.get("key")
        key = None if key_id is None or self._keys is None else self._keys.get(str(key_id))
        if overdue or left < 1.0:
            error = {"error": "deadline", "message": "the job's deadline passed", "status": 504}
            new = self.store.taken(record, stage="failed", error=error)
        elif retry and body is not None and key_id is not None and key is None:
            error = {"error": "key_revoked", "message": "the job's API key was revoked",
                     "status": 401}  # fmt: skip
            new = self.store.taken(record, stage="failed", error=error)
        elif retry and body is not None:
            new = self.store.taken(
                record, stage="queued", requeued=(record.requeued or 0) + 1,
                space=None, queue_position=None, estimate_s=None, partial=None,
                partial_index=None, upstream_rank=None, upstream_eta_s=None,
                upstream_queue_size=None, progress=None,
            )  # fmt: skip
        else:
            reason = (
                "its input files were on the lost worker"
                if retry
                else "the worker running it was lost after the Space accepted the call"
                " (not safe_to_retry)"
            )
            new = self.store.taken(record, stage="failed", error=_lost(reason))
        if not await self.store.claim(job_id, Holder(record.owner, record.fence), new):
            return 0  # another worker was faster
        _log.warning(
            "job reclaimed from a lost worker",
            extra={"job_id": job_id, "stage": new.stage, "requeued": new.requeued},
        )
        if new.final:
            await self.store.forget_run(job_id)
            return 1
        await self._resume(new, PredictRequest.model_validate(body), left, info, key)
        return 1

    async def _resume(
        self, record: JobRecord, body: PredictRequest, left: float, info: dict[str, Any],
        key: KeyRecord | None,
    ) -> None:  # fmt: skip
        """Run the job here, in what is left of its deadline (as its key's, if any)."""
        await self.store.track(
            record.job_id, float(info["deadline"]), info.get("body"), info.get("key")
        )
        await self.store.local.add(record)
        body = body.model_copy(update={"timeout_s": left})
        call = checked_call(body, self._boundary)
        if key is None:
            self.runner.start(record.job_id, body, call, self._files_for(body))
            return
        # The job's task copies this context: the key's consumer and meter follow it.
        consumer = CURRENT.set(key.consumer())
        gate = GATE.set(None if self._gate_of is None else self._gate_of(key.id))
        try:
            ctx = RequestContext(record.job_id, user=get_pool().hash_user(body.email), key=key.name)
            meter = METER.set(Meter(key.id, key.name, ctx))
            try:
                self.runner.start(record.job_id, body, call, self._files_for(body))
            finally:
                METER.reset(meter)
        finally:
            GATE.reset(gate)
            CURRENT.reset(consumer)
