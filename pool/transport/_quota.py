"""ZeroGPU quota messages: an app error whose text is the only signal.

A ZeroGPU Space charges GPU time to the identity on the request (the caller's
``x-ip-token``). When that identity's quota is spent, the Space answers with an
ordinary app error (``gr.Error``) whose message is one of (the ``spaces`` package,
``spaces/zero/client.py``; docs/hub.md "ZeroGPU: identity and quota"):

* ``You have exceeded your GPU quota (60s requested vs. 12s left). Try again in 2:05:11``
* ``You have exceeded your free GPU quota (...). Try again in 0:00:42`` (unlogged users)
* ``No GPU is currently available for you after 60s`` (no GPU free in time)
* older: ``... Please retry in 0:09:48``

:func:`quota_error` turns such a message into :class:`~pool.QuotaExceeded` with the
wait it names (``H:MM:SS``, ``MM:SS`` or ``Ns``); any other message is not a quota.
The quota belongs to the user, not the Space: the error is neutral for the Space's
window and breaker, and never retried nor failed over (pool/_failures.py).
"""

from __future__ import annotations

import re

from .._exceptions import QuotaExceeded

_EXCEEDED = re.compile(r"exceeded your (?:free |pro )?GPU quota", re.IGNORECASE)
_NO_GPU = re.compile(r"No GPU (?:is )?(?:currently )?available", re.IGNORECASE)
_WAIT = re.compile(r"(?:try again|retry) in\s+(?:(\d+):)?(\d{1,2}):(\d{2})", re.IGNORECASE)
_WAIT_S = re.compile(r"(?:try again|retry) in\s+(\d+(?:\.\d+)?)\s*s", re.IGNORECASE)
_NO_GPU_RETRY_S = 60.0  # "no GPU available" names no wait: GPUs free up within minutes


def retry_after_s(message: str) -> float | None:
    """The wait a quota message names (``Try again in 2:05:11`` → 7511.0), if any."""
    found = _WAIT.search(message)
    if found is not None:
        hours = int(found.group(1) or 0)
        return float(hours * 3600 + int(found.group(2)) * 60 + int(found.group(3)))
    seconds = _WAIT_S.search(message)
    return float(seconds.group(1)) if seconds is not None else None


def quota_error(message: str) -> QuotaExceeded | None:
    """:class:`QuotaExceeded` for a ZeroGPU quota message; None for any other text."""
    if _EXCEEDED.search(message):
        reason = "gpu_quota"
    elif _NO_GPU.search(message):
        reason = "no_gpu"
    else:
        return None
    wait = retry_after_s(message)
    if wait is None:
        wait = _NO_GPU_RETRY_S
    return QuotaExceeded(message[:300], retry_after_s=wait, reason=reason)
