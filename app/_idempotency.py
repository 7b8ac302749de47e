"""``Idempotency-Key`` on ``POST /api/jobs``: a retried submission gets the same job.

A client whose response was lost retries with the same key; within the job retention
time the same key from the same caller (bearer token and ``email``) names the job the
first request created, so the predict does not run twice. The key → job id mapping
lives in the coordinator's shared values (``idem:<hash>``, TTL the retention), set by
one compare-and-set, so concurrent retries on different workers agree too. Neither the
key nor the caller is stored in clear: the name is a hash of both.
"""

from __future__ import annotations

import hashlib

from pool.admission import SharedValues

PREFIX = "idem:"
MAX_KEY_CHARS = 255


def _name(caller: str, key: str) -> str:
    return PREFIX + hashlib.sha256(f"{caller}\0{key}".encode()).hexdigest()


async def reserve(values: SharedValues, caller: str, key: str, job_id: str, ttl_s: float) -> str:
    """The job id for ``(caller, key)``: ``job_id`` when the key is new, else the first's."""
    stored = await values.update(_name(caller, key), lambda held: held or job_id, ttl_s)
    return stored or job_id
