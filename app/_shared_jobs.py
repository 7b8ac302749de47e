"""Jobs readable from every worker: this worker's jobs mirrored to the coordinator.

Several uvicorn workers (or hosts) share one coordinator; a client's GET, SSE or DELETE
may land on a worker other than the one running the job. The running worker keeps the
authoritative record in its :class:`~app._jobs.MemoryJobStore` (events, history) and
writes each new version to the coordinator's shared values under ``job:<id>``, with
the retention as TTL. Another worker answers from there: GET reads it, SSE polls it,
DELETE leaves a ``jobcancel:<id>`` request that the owner's single poller picks up.

Each mirror names its owner (``JobRecord.owner``, this worker's id) and is written by
compare-and-set: a write over a mirror another worker has taken over
(:mod:`app._reclaim`: the owner was presumed dead, or a DELETE settled the job) is
refused, the local copy is forgotten and ``on_lost`` stops the local task. So a worker
that was frozen past its TTL and wakes up never overwrites what the fleet decided.

The mirror is best effort: if the store is unreachable the job still runs and stays
readable on its own worker. Partial outputs of a streaming job are mirrored at most
once per ``_POLL_S`` per job (the latest one, with a trailing write), so a fast stream
does not write the store per token; another worker's GET/SSE sees the latest partial
at that pace, and every other change (stages, the final result) at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from pool.admission import SharedValues

from ._jobs import JobRecord, MemoryJobStore
from ._schemas import FINAL_STAGES

_log = logging.getLogger("spacepool.app")
_JOB = "job:"
_CANCEL = "jobcancel:"
_POLL_S = 0.25
_PARTIAL_FIELDS = frozenset({"partial", "partial_index"})


class SharedJobStore:
    """A :class:`~app._jobs.JobStore` whose jobs every worker can read and cancel."""

    def __init__(
        self, local: MemoryJobStore, values: Callable[[], SharedValues], retention_s: float
    ) -> None:
        self.local = local
        self._values = values
        self._retention_s = retention_s
        self._mirrored_at: dict[str, float] = {}  # running job → last mirror (monotonic)
        self._later: dict[str, asyncio.Task[None]] = {}  # trailing partial mirrors
        self.worker = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.on_lost: Callable[[str], None] = lambda job_id: None

    async def _mirror(self, record: JobRecord | None) -> None:
        if record is None:
            return
        if record.final:
            self._mirrored_at.pop(record.job_id, None)
        else:
            self._mirrored_at[record.job_id] = time.monotonic()
        if not await self.claim(record.job_id, record.owner, record):
            _log.warning("job taken over by another worker", extra={"job_id": record.job_id})
            self._mirrored_at.pop(record.job_id, None)
            self.local.forget(record.job_id)
            self.on_lost(record.job_id)

    async def claim(self, job_id: str, owner: str | None, record: JobRecord) -> bool:
        """Write ``record`` as ``job_id``'s mirror if the mirror is absent or still
        ``owner``'s and not final; False when another worker holds it now. A store that
        cannot be reached counts as written (best effort: the job goes on regardless)."""
        text = json.dumps(asdict(record))

        def swap(current: str | None) -> str | None:
            if current is None:
                return text
            try:
                held = json.loads(current)
                if held.get("owner") == owner and held.get("stage") not in FINAL_STAGES:
                    return text
            except (ValueError, AttributeError):
                return text
            return current if current == text else None

        try:
            stored = await self._values().update(_JOB + job_id, swap, ttl_s=self._retention_s)
        except Exception as exc:
            _log.warning("could not share job state (%s)", type(exc).__name__)
            return True
        return stored == text

    async def remote(self, job_id: str) -> JobRecord | None:
        """The shared mirror of ``job_id`` (None: none, or the store is unreachable)."""
        return await self._remote(job_id)

    async def _remote(self, job_id: str) -> JobRecord | None:
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
        return await self.local.get(job_id) or await self._remote(job_id)

    async def update(
        self, job_id: str, *, expect_stage: str | None = None, **changes: Any
    ) -> JobRecord | None:
        if await self.local.get(job_id) is None:
            return await self._remote(job_id)  # another worker's job: it owns the state
        new = await self.local.update(job_id, expect_stage=expect_stage, **changes)
        if new is not None and not new.final and _PARTIAL_FIELDS.issuperset(changes):
            wait = self._mirrored_at.get(job_id, 0.0) + _POLL_S - time.monotonic()
            if wait > 0:  # mirrored a moment ago: the latest partial goes out later
                if job_id not in self._later:
                    task = asyncio.get_running_loop().create_task(self._mirror_later(job_id, wait))
                    self._later[job_id] = task
                return new
        await self._mirror(new)
        if new is not None and await self.local.get(job_id) is None:
            return await self._remote(job_id)  # taken over by another worker meanwhile
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
        while True:
            record = await self._remote(job_id)
            if record is None:
                return None
            if record.version > after_version:
                return [record.view()]
            if time.monotonic() >= deadline:
                return []
            await asyncio.sleep(_POLL_S)

    async def counts(self) -> dict[str, int]:
        return await self.local.counts()

    async def settle(self, job_id: str, **changes: Any) -> JobRecord | None:
        """Take the job over from its owner with ``changes`` (no-op once final)."""
        if await self.local.get(job_id) is not None:
            return await self.update(job_id, **changes)
        for _ in range(3):  # the owner may write in between: read again
            record = await self._remote(job_id)
            if record is None or record.final:
                return record
            new = replace(
                record, **changes, version=record.version + 1, updated_at=time.time(),
                owner=self.worker,
            )  # fmt: skip
            if await self.claim(job_id, record.owner, new):
                return new
        return await self._remote(job_id)

    async def request_cancel(self, job_id: str) -> bool:
        """Ask the worker that runs ``job_id`` to cancel it."""
        try:
            await self._values().put(_CANCEL + job_id, "1", ttl_s=60.0)
        except Exception:
            return False
        return True

    async def cancel_requests(self) -> list[str]:
        """Job ids whose cancellation some worker asked for (and forget the asks)."""
        try:
            asked = await self._values().scan(_CANCEL)
        except Exception:
            return []
        ids = [key[len(_CANCEL) :] for key in asked]
        for job_id in ids:
            if await self.local.get(job_id) is not None:
                with contextlib.suppress(Exception):
                    await self._values().delete(_CANCEL + job_id)
        return ids
