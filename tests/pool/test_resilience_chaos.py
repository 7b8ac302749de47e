"""Resilience against Spaces that really overflow or die: Gradio's own max_size, SIGKILL."""

from __future__ import annotations

import asyncio
import signal

import pytest

from devspaces import SpaceFleet, SpaceProcess
from pool import Pool, PoolError, PoolSettings, Prediction, UpstreamTransportError
from tests.pool.test_core import wait_until


async def test_gradio_max_size_overflow_is_queue_full_and_halves_the_window() -> None:
    """A Space with queue(max_size=1) and one worker refuses the overflow with Gradio's
    own 503: the pool sees queue_full (before acceptance) and halves the window; the
    refused calls are not failed at ``retry_attempts`` (1) but wait in the pool's queue
    again, within the queue timeout, and are served too."""
    with SpaceProcess("tiny", concurrency_limit=1, max_size=1) as tiny:
        # The four callers are anonymous, one consumer (issue 28): its cap out of the
        # way, as all four must reach the Space at once to overflow its queue.
        settings = PoolSettings(
            spaces=f"tiny={tiny.url}", coordinator_url="memory://", retry_attempts=1,
            min_connections=1, breaker_failures=50, anonymous_max_concurrent=1000,
        )  # fmt: skip
        pool = Pool(settings)
        try:
            await pool.start()
            outcomes = await asyncio.gather(
                *(pool.predict("/echo", f"c{i}", 1.0) for i in range(4)), return_exceptions=True
            )
            ok = [o for o in outcomes if isinstance(o, Prediction)]
            assert len(ok) == 4, outcomes
            assert sorted(o.result for o in ok) == [f"tiny:c{i}" for i in range(4)]
            assert max(o.attempts for o in ok) > 1, "some were refused, then waited again"
            assert pool.board.get("tiny").window < 4
            stats = await pool.stats()
            assert stats["admission"]["globalInUse"] == 0
        finally:
            await pool.aclose()


@pytest.mark.parametrize("safe", [False, True])
async def test_a_job_killed_mid_run_is_retried_only_when_safe(safe: bool) -> None:
    """SIGKILL of a Space while a predict runs on it: the job was accepted, so the pool
    does not repeat it behind the caller's back (a typed 'dropped' error) unless the
    caller said safe_to_retry, in which case it is served by the other Space."""
    with SpaceFleet(names=["doomed", "spare"]) as fleet:
        settings = PoolSettings(
            spaces=fleet.pool_spaces_env(), coordinator_url="memory://", min_connections=1,
            retry_backoff_s=0.01,
        )  # fmt: skip
        pool = Pool(settings)
        try:
            await pool.start()
            call = asyncio.create_task(
                pool.predict("/echo", "work", 3.0, space=None, safe_to_retry=safe, timeout=30)
            )
            await wait_until(lambda: fleet["doomed"].stats().in_flight == 1, 10)
            fleet["doomed"].kill(signal.SIGKILL)
            if safe:
                done = await call
                still = fleet["doomed"].is_running()
                assert (done.space, done.attempts) == ("spare", 2), (done, still)
            else:
                with pytest.raises(PoolError) as info:
                    await call
                assert isinstance(info.value, UpstreamTransportError), info.value
                assert not info.value.before_accept
                assert fleet["spare"].stats().total == 0, "not repeated behind the caller"
            assert pool.board.get("doomed").window == 2, "a killed job is a provider failure"
        finally:
            await pool.aclose()
