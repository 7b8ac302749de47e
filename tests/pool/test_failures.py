"""The failure table, the one failure path, and a release no cancel can cut short."""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import signal
from collections import Counter

import httpx
import pytest
from gradio_client.utils import QueueError, TooManyRequestsError

from devspaces import SpaceFleet, SpaceProcess, free_port
from pool import (
    NO_ROOM,
    BusyError,
    LeaseLost,
    Pool,
    PoolEvent,
    PoolSettings,
    QuotaExceeded,
    UpstreamTransportError,
)
from pool._failures import FAILURES, failure
from pool.admission import Lease, MemoryCoordinator
from pool.resilience import RetryPolicy
from pool.transport._errors import classify, classify_connect
from pool.transport._fallback import GradioFactory
from tests._vclock import VirtualClock
from tests.pool.test_core import wait_until

_REQUEST = httpx.Request("GET", "http://127.0.0.1/")


def _upstream_failures() -> list[BaseException]:
    """One of every exception gradio_client, httpx or the Hub can raise at us."""
    return [
        httpx.ConnectError("refused"),
        httpx.ConnectTimeout("slow"),
        httpx.ReadTimeout("slow"),
        httpx.ReadError("reset"),
        httpx.HTTPStatusError("5xx", request=_REQUEST, response=httpx.Response(503)),
        concurrent.futures.CancelledError(),
        QueueError("full"),
        TooManyRequestsError("429"),
        ConnectionResetError("reset"),
        ValueError("Space is in an invalid state"),
    ]


def test_every_transport_failure_kind_has_a_row_in_the_table() -> None:
    """A kind the classifier can produce but the table lacks would be treated as the
    caller's fault: no breaker, no failover. Every one has its row."""
    kinds = set()
    for exc in _upstream_failures():
        for classified in (classify(exc), classify_connect(exc)):
            if isinstance(classified.error, UpstreamTransportError):
                kinds.add(classified.error.kind)
                assert classified.error.kind in FAILURES, classified.error.kind
    assert {"connect", "timeout", "transport", "http_5xx", "dropped", "queue_full",
            "rate_limited", "invalid_state"} <= kinds  # fmt: skip
    assert failure("app_error") == failure("no-such-kind")  # neutral: the Space is fine
    assert not failure("app_error").provider and failure("timeout").provider


def test_the_retry_policy_reads_the_table() -> None:
    policy = RetryPolicy(attempts=3)
    refused = classify(httpx.ConnectError("refused")).error
    mid_job = classify(httpx.ReadTimeout("slow")).error
    assert policy.should_retry(refused, 1, safe_to_retry=False)
    assert not policy.should_retry(mid_job, 1, safe_to_retry=False)
    assert policy.should_retry(mid_job, 1, safe_to_retry=True)
    assert not policy.should_retry(refused, 3, safe_to_retry=True)  # attempts used up
    assert policy.should_reopen(refused, 1) and policy.should_reopen(refused, 2)
    assert not policy.should_reopen(refused, 3)
    assert not policy.should_reopen(classify(QueueError("full")).error, 1)


def test_only_a_refusal_for_want_of_room_waits_again() -> None:
    """The Space's full queue and a caller's own share taken (BusyError no_room) put a
    call back in the pool's queue; a queue timeout, a lost lease, a quota or a refused
    connection do not; the wait before is jittered within requeue_max_s."""
    policy = RetryPolicy(attempts=3, base_s=0.25, max_s=5.0)
    full = classify(QueueError("full")).error
    assert policy.should_requeue(full)
    assert policy.should_requeue(BusyError("share", queue_position=0, retry_after_s=1.0,
                                           reason=NO_ROOM))  # fmt: skip
    assert not policy.should_requeue(BusyError("timeout", queue_position=3, retry_after_s=1.0))
    assert not policy.should_requeue(LeaseLost("lost", why="expired", retry_after_s=1.0))
    assert not policy.should_requeue(QuotaExceeded("gpu", retry_after_s=60.0))
    assert not policy.should_requeue(classify(httpx.ConnectError("refused")).error)
    delays = [policy.requeue_delay(n, random.Random(n)) for n in range(1, 12)]
    assert all(0.0 <= d <= 2.0 for d in delays) and max(delays) > 0.25


async def test_connection_opens_are_retried_by_the_policy_then_fail_over(
    clean_fleet: SpaceFleet,
) -> None:
    """A Space nobody answers is opened exactly POOL_CONNECT_ATTEMPTS times, then the
    request is served elsewhere; the dead Space is counted once."""
    dead = f"http://127.0.0.1:{free_port()}/"
    opened: Counter[str] = Counter()
    real = GradioFactory(token=None, connect_timeout_s=5, read_timeout_s=30, max_workers=2)

    def counting(src: str) -> object:
        opened[src] += 1
        return real(src)

    settings = PoolSettings(
        spaces=f"dead={dead},{clean_fleet.pool_spaces_env()}",
        coordinator_url="memory://",
        connect_attempts=3,
    )
    pool = Pool(settings, client_factory=counting)
    events: list[PoolEvent] = []
    pool.hooks.append(events.append)
    try:
        await pool.start()
        user = "pinned@example.com"
        await pool.router.claim(pool.hash_user(user) or "", "dead")
        done = await pool.predict("/echo", "x", 0, email=user)
        assert done.space in ("alpha", "beta") and done.result == f"{done.space}:x"
        assert opened[dead] == 3
        dead_events = Counter(e.kind for e in events if e.space == "dead")
        assert dead_events["failover"] == 1 and dead_events["provider_error"] == 1
    finally:
        await pool.aclose()


async def test_a_space_killed_between_calls_is_failed_over_and_counted_once(
    clean_fleet: SpaceFleet,
) -> None:
    """The pooled connection's Space is gone: the call is retried on the other Space,
    the dead one marked down; one provider error, one failover, one retry."""
    with SpaceFleet(names=["f1"]) as doomed:
        pool = Pool(
            PoolSettings(
                spaces=f"f1={doomed['f1'].url},f2={clean_fleet['alpha'].url}",
                coordinator_url="memory://",
                min_connections=1,
                retry_backoff_s=0.01,
            )
        )
        events: list[PoolEvent] = []
        pool.hooks.append(events.append)
        try:
            first = await pool.predict("/echo", "warm", 0, space="f1")
            assert first.result == "f1:warm"
            doomed["f1"].kill(signal.SIGKILL)
            events.clear()
            user = "pinned@example.com"
            await pool.router.claim(pool.hash_user(user) or "", "f1")  # f1 is tried first
            done = await pool.predict("/echo", "x", 0, email=user, safe_to_retry=True)
            assert (done.space, done.result, done.attempts) == ("f2", "alpha:x", 2)
            on_f1 = Counter(e.kind for e in events if e.space == "f1")
            assert on_f1["failover"] == 1, events
            assert on_f1["provider_error"] == 1, events
            assert on_f1["retry"] == 1, events
            kind = next(e.outcome for e in events if e.kind == "provider_error")
            if failure(kind or "").down:  # refused: routed around for a cool-down
                assert (await pool.stats())["pools"]["f1"]["up"] is False
        finally:
            await pool.aclose()


class _SlowRelease(MemoryCoordinator):
    """A store whose releases take ``seconds`` on ``clock`` (a slow network to Redis, say)."""

    def __init__(self, seconds: float, clock: VirtualClock) -> None:
        super().__init__()
        self.seconds = seconds
        self.clock = clock
        self.releasing = asyncio.Event()  # a release has begun
        self.released = 0

    async def release(self, lease: Lease) -> None:
        self.releasing.set()
        await self.clock.sleep(self.seconds)
        await super().release(lease)
        self.released += 1


@pytest.fixture
def echo_space(clean_fleet: SpaceFleet) -> SpaceProcess:
    return clean_fleet["alpha"]


async def test_a_second_cancel_cannot_cut_the_release_short(echo_space: SpaceProcess) -> None:
    """Cancelled twice while its lease is being released, a request still returns its
    connection, releases its slot, reports the end and records its outcome."""
    clock = VirtualClock()
    store = _SlowRelease(5.0, clock)
    pool = Pool(
        PoolSettings(spaces=f"solo={echo_space.url}", min_connections=1),
        coordinator=store,
        clock=clock,
    )
    events: list[PoolEvent] = []
    pool.hooks.append(events.append)
    try:
        entered = asyncio.Event()

        async def caller() -> None:
            async with pool.client(None) as client:
                await client.predict("x", 0, api_name="/echo")
                entered.set()
                await asyncio.sleep(30)

        task = asyncio.create_task(caller())
        await entered.wait()
        task.cancel()
        await store.releasing.wait()  # now inside the release
        assert store.released == 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_until(lambda: store.released == 1, timeout_s=3)
        assert [e.outcome for e in events if e.kind == "finished"] == ["cancelled"]
        stats = await pool.stats()
        assert stats["inUseConnections"] == 0 and stats["admission"]["globalInUse"] == 0
    finally:
        await pool.aclose()


async def test_a_slow_release_does_not_hold_the_caller_past_its_deadline(
    echo_space: SpaceProcess,
) -> None:
    """The result is back by the deadline; the release (20 s) finishes on its own after."""
    clock = VirtualClock()
    store = _SlowRelease(0.0, clock)
    pool = Pool(
        PoolSettings(spaces=f"solo={echo_space.url}", min_connections=1),
        coordinator=store,
        clock=clock,
    )
    try:
        await pool.predict("/echo", "warm", 0, timeout=5)  # connect, outside the timing
        store.seconds = 20.0
        started = clock.now()
        done = await pool.predict("/echo", "x", 0, timeout=1.0)
        took = clock.now() - started
        assert done.result == "alpha:x"
        assert took < 1.9, f"held {took:.2f}s by a 20 s release"
        assert store.released == 1  # the warm-up's; this one's is still on its way
        await wait_until(lambda: store.released == 2, timeout_s=4)
        assert clock.now() - started >= 20.0
    finally:
        await pool.aclose()
