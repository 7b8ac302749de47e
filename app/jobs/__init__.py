"""Background jobs: the runner behind a small store interface, the shared store every
worker reads, reclaiming a lost worker's jobs, and idempotency keys."""

from __future__ import annotations

from ._idempotency import MAX_KEY_CHARS, Held, accept, caller_of, fingerprint_call, release, reserve
from ._reclaim import Reclaimer
from ._runner import JobRunner
from ._shared import SharedJobStore
from ._store import JobRecord, JobStore, MemoryJobStore

__all__ = [
    "MAX_KEY_CHARS",
    "Held",
    "JobRecord",
    "JobRunner",
    "JobStore",
    "MemoryJobStore",
    "Reclaimer",
    "SharedJobStore",
    "accept",
    "caller_of",
    "fingerprint_call",
    "release",
    "reserve",
]
