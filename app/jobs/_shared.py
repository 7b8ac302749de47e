"""Jobs readable from every worker: this worker's jobs mirrored to the coordinator.

Several uvicorn workers (or hosts) share one coordinator; a client's GET, SSE or DELETE
may land on a worker other than the one running the job. The running worker keeps the
authoritative record in its :class:`~app.jobs._store.MemoryJobStore` (events, history) and
writes each new version to the coordinator's shared values under ``job:<id>``, with
the retention as TTL, and indexes the job under ``jobrun:<id>`` (owner, deadline, and
the body when it could run again) for :mod:`app.jobs._reclaim`.

**Owned records** (:mod:`pool.admission._ownership`, the mechanism admission's leases
follow too). Each mirror names its owner and fencing token (``JobRecord.owner``,
``JobRecord.fence``) and every write is fenced: a write over a mirror another worker
took over (the owner was presumed dead, or a DELETE settled the job) is refused and
the local copy is forgotten. A takeover raises the token. So a worker that was
frozen past its TTL and wakes up never overwrites what the fleet decided.

**Changes are signalled, not polled** (``SharedValues.watch``: Redis pub/sub, or the
SQLite store's own loop). Another worker's GET reads the mirror; its SSE stream and a
DELETE waiting for the owner wake at each write of it. The owner of a running job
watches two keys of it (:meth:`SharedJobStore.stopped`): ``jobcancel:<id>``, which a
DELETE on another worker writes, and the mirror, which a takeover writes; either stops
the job at once.

The mirror is best effort: if the store is unreachable the job still runs and stays
readable on its own worker. Partial outputs of a streaming job are mirrored at most
once per ``_PARTIAL_S`` per job (the latest one, with a trailing write), so a fast
stream does not write the store per token; another worker's GET/SSE sees the latest
partial at that pace, and every other change (stages, the final result) at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from typing import Any, Literal

from pool.admission import Changed, Holder, SharedValues, taken_over, write_fenced

from ..edge import FINAL_STAGES
from ._store import JobRecord, MemoryJobStore

_log = logging.getLogger("spacepool.app")
_JOB = "job:"
_CANCEL = "jobcancel:"
RUN = "jobrun:"  # jobrun:<job id> → owner, deadline, body of a job not yet final
_PARTIAL_S = 0.25
_PARTIAL_FIELDS = frozenset({"partial", "partial_index"})


def _closed(held: Mapping[str, Any]) -> bool:
    return held.get("stage") in FINAL_STAGES


def _holder(record: JobRecord) -> Holder:
    return Holder(record.owner, record.fence)


class SharedJobStore:
    """A :class:`~app.jobs._store.JobStore` whose jobs every worker can read and cancel."""

    def __init__(
        self,
        local: MemoryJobStore,
        values: Callable[[], SharedValues],
        retention_s: float,
        ttl_s: float,
    ) -> None:
        self.local = local
        self._values = values
        self._retention_s = retention_s
        self._ttl_s = ttl_s
        self._mirrored_at: dict[str, float] = {}  # running job → last mirror (monotonic)
        self._later: dict[str, asyncio.Task[None]] = {}  # trailing partial mirrors
        self._refused: dict[str, asyncio.Event] = {}  # set when a mirror write is refused
        self.worker = f"{os.getpid()}-{secrets.token_hex(4)}"

    async def _mirror(self, record: JobRecord | None) -> None:
        if record is None:
            return
        if record.final:
            self._mirrored_at.pop(record.job_id, None)
        else:
            self._mirrored_at[record.job_id] = time.monotonic()
        if not await self.claim(record.job_id, _holder(record), record):
            _log.warning("job taken over by another worker", extra={"job_id": record.job_id})
            self._mirrored_at.pop(record.job_id, None)
            self.local.forget(record.job_id)
            if (refused := self._refused.get(record.job_id)) is not None:
                refused.set()  # stopped() returns "lost"

    async def claim(self, job_id: str, holder: Holder, record: JobRecord) -> bool:
        """Write ``record`` as ``job_id``'s mirror if the mirror is absent or still
        ``holder``'s and not final; False when another worker holds it now. A store that
        cannot be reached counts as written (best effort: the job goes on regardless)."""
        text = json.dumps(asdict(record))
        try:
            return await write_fenced(
                self._values(), _JOB + job_id, text, holder, ttl_s=self._retention_s,
                closed=_closed,
            )  # fmt: skip
        except Exception as exc:
            _log.warning("could not share job state (%s)", type(exc).__name__)
            return True

    async def remote(self, job_id: str) -> JobRecord | None:
        """The shared mirror of ``job_id`` (None: none, or the store is unreachable)."""
        try:
            raw = await self._values().get(_JOB + job_id)
        except Exception:
            return None
        if raw is None:
            return None
        try:
            return JobRecord(**json.loads(raw))
        except (TypeError, ValueError):
            return None

    async def add(self, record: JobRecord) -> None:
        await self.local.add(record)
        await self._mirror(record)

    async def get(self, job_id: str) -> JobRecord | None:
        return await self.local.get(job_id) or await self.remote(job_id)

    async def update(
        self, job_id: str, *, expect_stage: str | None = None, **changes: Any
    ) -> JobRecord | None:
        if await self.local.get(job_id) is None:
            return await self.remote(job_id)  # another worker's job: it owns the state
        new = await self.local.update(job_id, expect_stage=expect_stage, **changes)
        if new is not None and not new.final and _PARTIAL_FIELDS.issuperset(changes):
            wait = self._mirrored_at.get(job_id, 0.0) + _PARTIAL_S - time.monotonic()
            if wait > 0:  # mirrored a moment ago: the latest partial goes out later
                if job_id not in self._later:
                    task = asyncio.get_running_loop().create_task(self._mirror_later(job_id, wait))
                    self._later[job_id] = task
                return new
        await self._mirror(new)
        if new is not None and await self.local.get(job_id) is None:
            return await self.remote(job_id)  # taken over by another worker meanwhile
        return new

    async def _mirror_later(self, job_id: str, wait: float) -> None:
        try:
            await asyncio.sleep(wait)
        finally:
            self._later.pop(job_id, None)
        await self._mirror(await self.local.get(job_id))

    async def changes(
        self, job_id: str, after_version: int, timeout: float
    ) -> list[dict[str, Any]] | None:
        if await self.local.get(job_id) is not None:
            found = await self.local.changes(job_id, after_version, timeout)
            if found is not None or await self.local.get(job_id) is not None:
                return found  # else: taken over meanwhile, follow the mirror
        deadline = time.monotonic() + max(timeout, 0.0)
        async with self._values().watch(_JOB + job_id) as changed:
            while True:
                record = await self.remote(job_id)
                if record is None:
                    return None
                if record.version > after_version:
                    return [record.view()]
                left = deadline - time.monotonic()
                if left <= 0 or not await changed.wait(left):
                    return []

    async def counts(self) -> dict[str, int]:
        return await self.local.counts()

    async def settle(self, job_id: str, **changes: Any) -> JobRecord | None:
        """Take the job over from its owner with ``changes`` (no-op once final)."""
        if await self.local.get(job_id) is not None:
            return await self.update(job_id, **changes)
        for _ in range(3):  # the owner may write in between: read again
            record = await self.remote(job_id)
            if record is None or record.final:
                return record
            new = self.taken(record, **changes)
            if await self.claim(job_id, _holder(record), new):
                return new
        return await self.remote(job_id)

    def taken(self, record: JobRecord, **changes: Any) -> JobRecord:
        """``record`` taken over by this worker, with ``changes`` (the token raised)."""
        return replace(
            record, **changes, version=record.version + 1, updated_at=time.time(),
            owner=self.worker, fence=record.fence + 1,
        )  # fmt: skip

    async def request_cancel(self, job_id: str) -> bool:
        """Ask the worker that runs ``job_id`` to cancel it."""
        try:
            await self._values().put(_CANCEL + job_id, "1", ttl_s=60.0)
        except Exception:
            return False
        return True

    async def stopped(self, job_id: str) -> Literal["cancel", "lost"]:
        """Wait until this worker's job must stop: ``"cancel"`` (another worker asked)
        or ``"lost"`` (another worker took it over)."""
        values = self._values()
        refused = self._refused[job_id] = asyncio.Event()
        try:
            async with values.watch(_CANCEL + job_id) as asked, \
                    values.watch(_JOB + job_id) as mirrored:  # fmt: skip
                check_asked = check_mirror = True
                while True:
                    if check_asked and await self._asked(job_id):
                        return "cancel"
                    if refused.is_set() or (check_mirror and await self._taken(job_id)):
                        return "lost"
                    check_asked, check_mirror = await _first(asked, mirrored, refused)
        finally:
            if self._refused.get(job_id) is refused:
                del self._refused[job_id]

    async def _asked(self, job_id: str) -> bool:
        with contextlib.suppress(Exception):
            if await self._values().get(_CANCEL + job_id) is not None:
                with contextlib.suppress(Exception):
                    await self._values().delete(_CANCEL + job_id)
                return True
        return False

    async def _taken(self, job_id: str) -> bool:
        mine = await self.local.get(job_id)
        if mine is None:
            return True  # forgotten: a write of it was refused
        try:
            raw = await self._values().get(_JOB + job_id)
            return raw is not None and taken_over(json.loads(raw), _holder(mine))
        except Exception:
            return False  # unreadable, or the store is away: it stays ours

    # -- the index of running jobs (app/jobs/_reclaim.py) ----------------------------------------
    async def track(
        self, job_id: str, deadline: float, body: dict[str, Any] | None, key: str | None = None
    ) -> None:
        """Index a job this worker runs (its body too when it could run again, and the
        API key it runs for)."""
        info = {"owner": self.worker, "deadline": deadline, "body": body, "key": key}
        ttl = max(deadline - time.time(), 0.0) + 3 * self._ttl_s
        with contextlib.suppress(Exception):  # best effort, as the mirror
            await self._values().put(RUN + job_id, json.dumps(info), ttl_s=ttl)

    async def untrack(self, job_id: str) -> None:
        """The job ended here: drop it from the index (if it is still this worker's)."""
        raw = await self._values().get(RUN + job_id)
        if raw is not None and json.loads(raw).get("owner") == self.worker:
            await self._values().delete(RUN + job_id)

    async def runs(self) -> dict[str, dict[str, Any]]:
        """The index: job id → owner, deadline, body, key."""
        found = await self._values().scan(RUN)
        return {key[len(RUN) :]: json.loads(raw) for key, raw in found.items()}

    async def forget_run(self, job_id: str) -> None:
        with contextlib.suppress(Exception):
            await self._values().delete(RUN + job_id)


async def _first(asked: Changed, mirrored: Changed, refused: asyncio.Event) -> tuple[bool, bool]:
    """Wait for the first of the three wake-ups; which of the keys to read again."""
    waits = {
        asyncio.ensure_future(asked.wait()): "asked",
        asyncio.ensure_future(mirrored.wait()): "mirrored",
        asyncio.ensure_future(refused.wait()): "refused",
    }
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
    fired = {waits[task] for task in done}
    return "asked" in fired, "mirrored" in fired

