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
the backoff's cap (0.25 s) instead of waiting for the kernel's growing retransmission
interval. Repeats are harmless: gradio answers a cancel of an event it no longer
runs all the same (gradio/routes.py ``cancel_event``).

A fallback job (``gradio_client``) is settled by its first cancel, which waits in its
thread for the Space to name the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..resilience import RetryPolicy
from ..transport import SpaceCall

_log = logging.getLogger("spacepool")

ATTEMPT_S = 0.75  # one POST cancel at most this long
GIVE_UP_S = 600.0  # past this, the Space has long noticed the session's stream is gone
# Between attempts: 50 ms doubling to 250 ms, jittered (the one retry policy's backoff).
BACKOFF = RetryPolicy(attempts=1, base_s=0.05, max_s=0.25)


async def deliver_cancel(call: SpaceCall) -> None:
    """Cancel ``call`` upstream until it is settled (never raises)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + GIVE_UP_S
    attempt = call.cancel  # the first marks the call cancelled; the others repost
    tries = 0
    while True:
        tries += 1
        with contextlib.suppress(Exception):
            async with asyncio.timeout(ATTEMPT_S):
                await attempt()
        if call.cancel_settled:
            if tries > 1:
                _log.info("upstream cancel delivered after %d attempts", tries)
            return
        if not call.reachable:  # the pool closed: nobody can post it now
            return
        if loop.time() >= give_up:
            _log.warning("upstream cancel not confirmed after %.0f s; given up", GIVE_UP_S)
            return
        attempt = call.send_cancel
        await asyncio.sleep(BACKOFF.delay(tries))


async def first_attempt(pending: asyncio.Future[None]) -> None:
    """Wait for a cancel in delivery as long as one attempt takes, not longer: a
    caller's deadline is not held up by a Space it cannot reach."""
    await asyncio.wait({pending}, timeout=ATTEMPT_S)
