"""The jobs' store: :class:`JobRecord` (one job's state, a new record per change), the
:class:`JobStore` interface and :class:`MemoryJobStore`, the in-process one (the shared
one is :mod:`app.jobs._shared`). How jobs run and their stages: :mod:`app.jobs._runner`."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from ..core import JobsFull
from ..edge import FINAL_STAGES

_HISTORY = 32


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class JobRecord:
    """One job's state; a new record (``version + 1``) for every change."""

    job_id: str
    stage: str
    created_at: float
    updated_at: float
    version: int = 1
    queue_position: int | None = None
    estimate_s: float | None = None
    space: str | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    queued_ms: float | None = None
    duration_ms: float | None = None
    partial: Any = None  # the latest partial output (JSON already), while streaming
    partial_index: int | None = None
    upstream_rank: int | None = None  # app/calls/_progress.py: what the Space says
    upstream_eta_s: float | None = None
    upstream_queue_size: int | None = None
    progress: list[dict[str, Any]] | None = None
    log: dict[str, Any] | None = None
    requeued: int | None = None  # times another worker took the job over (app/jobs/_reclaim.py)
    owner: str | None = None  # the worker running it (shared stores); never shown
    team: str | None = None  # the API key id it was made with (None: none); never shown
    fence: int = 0  # its fencing token: raised by each takeover (pool/admission/_ownership)

    @property
    def final(self) -> bool:
        return self.stage in FINAL_STAGES

    def view(self) -> dict[str, Any]:
        """The public JSON: optional keys only when they mean something."""
        out: dict[str, Any] = {
            "job_id": self.job_id,
            "stage": self.stage,
            "version": self.version,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
        }
        if self.stage == "queued" and self.queue_position:
            out["queue_position"] = self.queue_position
            if self.estimate_s is not None:
                out["estimate_s"] = self.estimate_s
        for key in ("space", "queued_ms", "duration_ms", "error", "upstream_rank",
                    "upstream_queue_size", "upstream_eta_s", "progress", "log",
                    "requeued"):  # fmt: skip
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.partial_index is not None:
            out["partial_index"] = self.partial_index
            if self.stage != "done":  # once done, the result is the last partial
                out["partial"] = self.partial
        if self.stage == "done":
            out["result"] = self.result
        return out


_FIELDS = frozenset(f.name for f in fields(JobRecord))


class JobStore(Protocol):
    """Where jobs live: :class:`MemoryJobStore` (one process), or
    :class:`~app.jobs._shared.SharedJobStore` (every worker reads and cancels)."""

    async def add(self, record: JobRecord) -> None:
        """Keep a new job; :class:`~app.core._errors.JobsFull` when no room can be made."""
        ...

    async def get(self, job_id: str) -> JobRecord | None: ...

    async def update(
        self, job_id: str, *, expect_stage: str | None = None, **changes: Any
    ) -> JobRecord | None:
        """Apply ``changes`` (if the stage is still ``expect_stage``); no-op once final."""
        ...

    async def changes(
        self, job_id: str, after_version: int, timeout: float
    ) -> list[dict[str, Any]] | None:
        """Views newer than ``after_version``, waiting up to ``timeout`` for one.

        ``[]`` on timeout; None once the job is unknown (expired or never existed).
        """
        ...

    async def counts(self) -> dict[str, int]: ...

    async def request_cancel(self, job_id: str) -> bool:
        """Ask whichever worker runs ``job_id`` to cancel it; False when no other worker
        can be reached this way (a store of one process)."""
        ...

    async def settle(self, job_id: str, **changes: Any) -> JobRecord | None:
        """Apply ``changes`` to a job whichever worker owns it (the fleet overrules an
        owner that does not answer); the record afterwards."""
        ...

    async def stopped(self, job_id: str) -> Literal["cancel", "lost"]:
        """Wait until this worker's job ``job_id`` must stop: another worker asked to
        cancel it, or took it over (never, in a store of one process)."""
        ...

    async def track(
        self, job_id: str, deadline: float, body: dict[str, Any] | None, key: str | None = None
    ) -> None:
        """Index a job this worker runs, for a takeover if the worker is lost (``body``:
        None when it cannot run again elsewhere; ``key``: the API key it runs for)."""
        ...

    async def untrack(self, job_id: str) -> None:
        """The job ended here: it leaves the index."""
        ...


@dataclass
class _Entry:
    record: JobRecord
    history: deque[dict[str, Any]]
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def since(self, version: int) -> list[dict[str, Any]]:
        return [view for view in self.history if view["version"] > version]


class MemoryJobStore:
    """Jobs of this process: retention by age of finished jobs and a bound on count.

    Each job keeps its latest ``history`` views (``POOL_STREAM_KEEP`` in the service): an
    SSE reader further behind skips older ones (partials of a fast stream) and still
    gets the latest and the final one.
    """

    def __init__(
        self,
        *,
        retention_s: float,
        max_jobs: int,
        clock: Callable[[], float] = time.time,
        history: int = _HISTORY,
    ) -> None:
        self.retention_s = retention_s
        self.max_jobs = max_jobs
        self.history = max(1, history)
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._finished: OrderedDict[str, float] = OrderedDict()  # job_id → finished at

    # -- state changes: plain methods, no await -------------------------------------------
    def _prune(self) -> None:
        """Drop finished jobs past retention (oldest first)."""
        horizon = self._clock() - self.retention_s
        while self._finished:
            job_id, finished_at = next(iter(self._finished.items()))
            if finished_at > horizon:
                break
            self._drop(job_id)

    def _drop(self, job_id: str) -> None:
        self._finished.pop(job_id, None)
        entry = self._entries.pop(job_id, None)
        if entry is not None:
            entry.changed.set()  # wake watchers: they will find the job gone

    def forget(self, job_id: str) -> None:
        """Drop a job another worker took over: reads go to the shared store from now on."""
        self._drop(job_id)

    def _live(self, job_id: str) -> _Entry | None:
        self._prune()
        return self._entries.get(job_id)

    def _add(self, record: JobRecord) -> None:
        self._prune()
        while len(self._entries) >= self.max_jobs and self._finished:
            self._drop(next(iter(self._finished)))
        if len(self._entries) >= self.max_jobs:
            raise JobsFull(self.max_jobs, retry_after_s=10.0)
        entry = _Entry(record, deque(maxlen=self.history))
        entry.history.append(record.view())
        self._entries[record.job_id] = entry

    def _update(
        self, job_id: str, expect_stage: str | None, changes: dict[str, Any]
    ) -> JobRecord | None:
        entry = self._live(job_id)
        if entry is None:
            return None
        old = entry.record
        if old.final or (expect_stage is not None and old.stage != expect_stage):
            return old
        unknown = set(changes) - _FIELDS
        if unknown:
            raise TypeError(f"unknown job fields: {sorted(unknown)}")
        new = replace(old, **changes, version=old.version + 1, updated_at=self._clock())
        if new == replace(old, version=new.version, updated_at=new.updated_at):
            return old  # nothing changed: no event
        entry.record = new
        entry.history.append(new.view())
        if new.final:
            self._finished[job_id] = new.updated_at
        entry.changed, wake = asyncio.Event(), entry.changed
        wake.set()
        return new

    # -- the interface ------------------------------------------------------------------
    async def add(self, record: JobRecord) -> None:
        self._add(record)

    async def get(self, job_id: str) -> JobRecord | None:
        entry = self._live(job_id)
        return entry.record if entry else None

    async def update(
        self, job_id: str, *, expect_stage: str | None = None, **changes: Any
    ) -> JobRecord | None:
        return self._update(job_id, expect_stage, changes)

    async def changes(
        self, job_id: str, after_version: int, timeout: float
    ) -> list[dict[str, Any]] | None:
        entry = self._live(job_id)
        if entry is None:
            return None
        pending = entry.since(after_version)
        if pending or timeout <= 0:
            return pending
        wake = entry.changed
        try:
            async with asyncio.timeout(timeout):
                await wake.wait()
        except TimeoutError:
            return []
        entry = self._live(job_id)
        return entry.since(after_version) if entry else None

    async def counts(self) -> dict[str, int]:
        self._prune()
        out: dict[str, int] = {}
        for entry in self._entries.values():
            out[entry.record.stage] = out.get(entry.record.stage, 0) + 1
        return out

    async def request_cancel(self, job_id: str) -> bool:
        return False  # one process: a job not running here runs nowhere

    async def settle(self, job_id: str, **changes: Any) -> JobRecord | None:
        return self._update(job_id, None, changes)

    async def stopped(self, job_id: str) -> Literal["cancel", "lost"]:
        await asyncio.Event().wait()  # one process: nobody else cancels or takes it
        raise AssertionError("unreachable")

    async def track(
        self, job_id: str, deadline: float, body: dict[str, Any] | None, key: str | None = None
    ) -> None:
        return None

    async def untrack(self, job_id: str) -> None:
        return None
