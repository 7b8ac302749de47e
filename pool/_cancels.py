"""Upstream cancels that are delivered, not tried once and forgotten.

A cancel posted while the host cannot reach the Space (a partition, a lost route)
fails; if nothing tries again, the job runs on at the Space after the host's lease
is gone, next to the jobs of whoever got the slot (seen: 4 calls at once against a
cap of 2 for 7.1 s, 154 s with a longer cut). So a native call's cancel is posted
again with backoff until the Space confirms it or the call is known to have ended
(:attr:`pool.transport.Call.cancel_settled`), for as long as :data:`GIVE_UP_S` or
until the pool closes (its HTTP client with it).

Each attempt is bounded by :data:`ATTEMPT_S`: an attempt stuck on dropped packets is
abandoned (its connection closed) and the next one opens a new connection, so once
packets flow again a cancel reaches the Space within about ``ATTEMPT_S`` +
:data:`BACKOFF_MAX_S` instead of waiting for the kernel's growing retransmission
interval. Repeats are harmless: gradio answers a cancel of an event it no longer
runs all the same (gradio/routes.py ``cancel_event``).

The fallback transport (a ``gradio_client`` job) is cancelled once, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from .transport import Call

_log = logging.getLogger("spacepool")

ATTEMPT_S = 0.75  # one POST cancel at most this long
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 0.25
GIVE_UP_S = 600.0  # past this, the Space has long noticed the session's stream is gone


async def deliver_cancel(job: Any) -> None:
    """Cancel ``job`` upstream; a native call until it is settled (never raises)."""
    if not isinstance(job, Call):
        with contextlib.suppress(Exception):
            await job.cancel()
        return
    loop = asyncio.get_running_loop()
    give_up = loop.time() + GIVE_UP_S
    delay = BACKOFF_FIRST_S
    attempt = job.cancel  # the first marks the call cancelled; the others repost
    tries = 0
    while True:
        tries += 1
        with contextlib.suppress(Exception):
            async with asyncio.timeout(ATTEMPT_S):
                await attempt()
        if job.cancel_settled:
            if tries > 1:
                _log.info("upstream cancel delivered after %d attempts", tries)
            return
        if job.session.space.http.is_closed:  # the pool closed: nobody can post it now
            return
        if loop.time() >= give_up:
            _log.warning("upstream cancel not confirmed after %.0f s; given up", GIVE_UP_S)
            return
        attempt = job.send_cancel
        await asyncio.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX_S)


async def first_attempt(pending: asyncio.Future[None]) -> None:
    """Wait for a cancel in delivery as long as one attempt takes, not longer: a
    caller's deadline is not held up by a Space it cannot reach."""
    await asyncio.wait({pending}, timeout=ATTEMPT_S)
