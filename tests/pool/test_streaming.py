"""Streaming through the library against real Gradio generator and chat Spaces: partials
in order and on time, the latest N kept for slow readers, deadline/cancel/slot release,
no retry once a partial was delivered, and gr.State never shared across leases."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from devspaces import SpaceProcess
from pool import (
    DeadlineExceeded,
    Partial,
    Pool,
    PoolEvent,
    PoolSettings,
    UpstreamAppError,
    UpstreamTransportError,
)
from tests.conftest import spaces_env

PoolBuilder = Callable[..., Pool]


@pytest.fixture
async def make_stream_pool(
    stream_spaces: dict[str, SpaceProcess],
) -> AsyncIterator[PoolBuilder]:
    """Pools over the streamer and chat stand-ins (in-process admission); closed after."""
    for space in stream_spaces.values():
        space.control(mode="ok")
        space.reset()
    pools: list[Pool] = []

    def build(**overrides: object) -> Pool:
        values: dict[str, object] = {
            "spaces": spaces_env(stream_spaces),
            "coordinator_url": "memory://",
            "min_connections": 1,
            "queue_timeout_s": 10.0,
        }
        values.update(overrides)
        pool = Pool(PoolSettings(**values))  # type: ignore[arg-type]
        pools.append(pool)
        return pool

    yield build
    for pool in pools:
        await pool.aclose()


async def idle(pool: Pool, space: SpaceProcess, timeout_s: float = 10.0) -> None:
    """Wait (bounded) until the Space runs nothing and the pool holds no slot."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = await pool.stats()
        if (
            await asyncio.to_thread(lambda: space.stats().in_flight) == 0
            and stats["inUseConnections"] == 0
            and stats["admission"]["globalInUse"] == 0
        ):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not idle within {timeout_s} s: {stats['admission']}")
        await asyncio.sleep(0.05)


async def test_stream_yields_each_partial_in_order_soon_after_the_space(
    make_stream_pool: PoolBuilder,
) -> None:
    """job.stream() yields the generator's 4 partials in order, each < 200 ms after the
    Space yielded it (Space's clock; on one of two runs, for a loaded machine's stalls),
    then ends; the last one is the job's result."""
    pool = make_stream_pool()
    seen: list[tuple[int, float]] = []
    for _ in range(2):
        async with pool.client(space="streamer") as client:
            job = await client.submit("w", 4, 0.3, api_name="/stream")
            assert job.generator
            seen = []
            async for out in job.stream(timeout=30):
                seen.append((out["index"], time.time() - out["t"]))
            result = await job
        assert [index for index, _ in seen] == [0, 1, 2, 3]
        assert result["index"] == 3 and result["text"] == "w0 w1 w2 w3"
        if all(0 <= lag < 0.2 for _, lag in seen):
            return
    pytest.fail(f"a partial came 200 ms or more after its yield in two runs: {seen}")


async def test_plain_endpoint_streams_its_one_result(make_stream_pool: PoolBuilder) -> None:
    """A non-generator endpoint: generator is False, stream() yields the result once."""
    pool = make_stream_pool()
    async with pool.client(space="streamer") as client:
        job = await client.submit("x", 0.1, api_name="/echo")
        assert not job.generator
        assert [out async for out in job.stream()] == ["streamer:x"]


async def test_a_reader_behind_gets_only_the_latest_kept_partials(
    make_stream_pool: PoolBuilder,
) -> None:
    """POOL_STREAM_KEEP=2: a reader that starts after 6 partials gets indexes 4 and 5."""
    pool = make_stream_pool(stream_keep=2)
    async with pool.client(space="streamer") as client:
        job = await client.submit("k", 6, 0.0, api_name="/stream")
        await job
        partials = [p async for p in job.partials()]
    assert [p.index for p in partials] == [4, 5]
    assert partials[-1].output["text"] == "k0 k1 k2 k3 k4 k5"


async def test_predict_on_partial_delivers_partials_then_the_result(
    make_stream_pool: PoolBuilder,
) -> None:
    """Pool.predict(on_partial=...) awaits the callback per partial; result = the last."""
    pool = make_stream_pool()
    got: list[Partial] = []

    async def on_partial(partial: Partial) -> None:
        got.append(partial)

    done = await pool.predict("/stream", "p", 3, 0.05, space="streamer", on_partial=on_partial)
    assert [p.index for p in got] == [0, 1, 2]
    assert done.result == got[-1].output and done.attempts == 1
    plain = await pool.predict("/echo", "q", 0, space="streamer", on_partial=on_partial)
    assert plain.result == "streamer:q" and len(got) == 3  # no partial for a plain endpoint


async def test_app_error_after_partials_carries_the_apps_message(
    make_stream_pool: PoolBuilder, stream_spaces: dict[str, SpaceProcess]
) -> None:
    """/stream_fail: both partials arrive, then UpstreamAppError with the gr.Error text."""
    pool = make_stream_pool()
    got: list[Partial] = []

    async def on_partial(partial: Partial) -> None:
        got.append(partial)

    with pytest.raises(UpstreamAppError, match=r"^stream failed: e$"):
        await pool.predict("/stream_fail", "e", 2, 0.05, space="streamer", on_partial=on_partial)
    assert [p.index for p in got] == [0, 1]
    await idle(pool, stream_spaces["streamer"])


async def test_deadline_mid_stream_cancels_upstream_and_frees_the_slot(
    make_stream_pool: PoolBuilder, stream_spaces: dict[str, SpaceProcess]
) -> None:
    """timeout=1 s on a 10 s stream: DeadlineExceeded after some partials; the Space's
    generator stops and every slot is free."""
    pool = make_stream_pool()
    got: list[Partial] = []

    async def on_partial(partial: Partial) -> None:
        got.append(partial)

    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        await pool.predict(
            "/stream", "d", 50, 0.2, space="streamer", timeout=1.0, on_partial=on_partial
        )
    assert time.monotonic() - started < 3.0
    assert 1 <= len(got) < 50
    await idle(pool, stream_spaces["streamer"])


async def test_cancelling_a_stream_reader_cancels_the_job_and_frees_the_slot(
    make_stream_pool: PoolBuilder, stream_spaces: dict[str, SpaceProcess]
) -> None:
    """The task reading job.stream() is cancelled after the first partial: the Space's
    generator stops and the slot is given back."""
    pool = make_stream_pool()
    first = asyncio.Event()

    async def read() -> None:
        async with pool.client(space="streamer") as client:
            job = await client.submit("c", 50, 0.2, api_name="/stream")
            async for _ in job.stream():
                first.set()

    task = asyncio.create_task(read())
    async with asyncio.timeout(10):
        await first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await idle(pool, stream_spaces["streamer"])


async def test_a_job_left_right_after_submit_is_cancelled_on_the_space(
    make_stream_pool: PoolBuilder, stream_spaces: dict[str, SpaceProcess]
) -> None:
    """The lease ends right after submit (join still on its way): the lease waits until
    the Space named the job and cancels it there, instead of closing the connection
    under it (the Space then ran the 4 s stream to its end, unwatched)."""
    streamer = stream_spaces["streamer"]
    pool = make_stream_pool(max_connections=1)
    await pool.predict("/echo", "warm", 0, space="streamer")
    streamer.reset()
    async with pool.client(space="streamer") as client:
        await client.submit("gone", 20, 0.2, api_name="/stream")
    # Uncancelled, the stream would run 4 s. The cancel may also land before the Space
    # started the job (then it never runs): look until a call ended, or past the 4 s.
    deadline = time.monotonic() + 5
    calls = await asyncio.to_thread(streamer.intervals)
    while not calls and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        calls = await asyncio.to_thread(streamer.intervals)
    assert len(calls) <= 1 and all(end - start < 2.0 for start, end in calls), calls
    assert streamer.stats().in_flight == 0, "the job still runs on the Space"
    await idle(pool, streamer)


async def test_no_retry_once_a_partial_was_delivered(
    make_stream_pool: PoolBuilder,
) -> None:
    """The Space dies after the first partial: even with safe_to_retry the call is not
    repeated (no retry event), the caller gets the transport error."""
    doomed = SpaceProcess("doomed", kind="stream")
    try:
        pool = make_stream_pool(spaces=f"doomed={doomed.url}", retry_backoff_s=0.0)
        events: list[PoolEvent] = []
        pool.hooks.append(events.append)

        async def on_partial(partial: Partial) -> None:
            await asyncio.to_thread(doomed.kill)

        with pytest.raises(UpstreamTransportError):
            await pool.predict(
                "/stream", "r", 20, 0.1, space="doomed", safe_to_retry=True,
                on_partial=on_partial, timeout=20,
            )  # fmt: skip
        assert not [e for e in events if e.kind == "retry"]
    finally:
        doomed.stop()


async def chat(pool: Pool, email: str, message: str) -> str:
    """One /chat turn on the chat Space, streamed; returns the final reply."""
    async with pool.client(email, space="chat") as client:
        job = await client.submit(message, api_name="/chat")
        replies = [reply async for reply in job.stream(timeout=30)]
        assert replies and replies[-1] == await job
        return str(replies[-1])


async def test_chat_history_in_gr_state_is_never_shared_between_users(
    make_stream_pool: PoolBuilder,
) -> None:
    """One pooled connection (max 1): A's two turns share A's history; B, next on the
    same connection, starts with none and never sees A's message; A's next lease too."""
    pool = make_stream_pool(min_connections=1, max_connections=1)
    async with pool.client("a@example.com", space="chat") as client:
        job = await client.submit("secret-of-a", api_name="/chat")
        assert "earlier: (nothing)" in await job
        job = await client.submit("second", api_name="/chat")
        assert "earlier: secret-of-a" in await job  # history kept within the lease
        connection = id(client.raw)
    async with pool.client("b@example.com", space="chat") as client:
        assert id(client.raw) == connection, "the same connection was reused"
    reply = await chat(pool, "b@example.com", "hello")
    assert "earlier: (nothing)" in reply and "secret" not in reply
    reply = await chat(pool, "a@example.com", "again")
    assert "earlier: (nothing)" in reply and "hello" not in reply
    assert pool.spaces["chat"].total == 1


async def test_chat_space_gr_error_reaches_the_caller_as_its_message(
    make_stream_pool: PoolBuilder,
) -> None:
    """gr.Error("failed: boom") in the chat Space: UpstreamAppError with that message."""
    pool = make_stream_pool()
    with pytest.raises(UpstreamAppError, match=r"^failed: boom$"):
        await pool.predict("/fail", "boom", space="chat")
