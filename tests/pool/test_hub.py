"""Hub behaviours on stand-ins: ZeroGPU identity and quota, 429 Retry-After, private Spaces."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import pytest
import uvicorn

from devspaces import SpaceFleet, SpaceProcess, free_port
from devspaces._front import cookie_front
from pool import (
    NoHealthySpaceError,
    Pool,
    PoolEvent,
    PoolSettings,
    QuotaExceeded,
    UpstreamError,
    UpstreamEvent,
    UpstreamQueued,
)
from pool.connections._replicas import KEEP, Replicas
from pool.transport._quota import quota_error

SECRET = "hf_private_token_for_tests_7c3d91"


@pytest.fixture
def hub(zero: SpaceProcess, clean_fleet: SpaceFleet) -> dict[str, SpaceProcess]:
    """"zero", and the shared fleet's alpha ("limited" below) and beta ("private")."""
    return {"zero": zero, "limited": clean_fleet["alpha"], "private": clean_fleet["beta"]}


def _pool(spaces: list[SpaceProcess], **overrides: object) -> Pool:
    values: dict[str, object] = {
        "spaces": ",".join(f"{s.name}={s.url}" for s in spaces),
        "coordinator_url": "memory://",
        "queue_timeout_s": 10.0,
        "min_connections": 1,
    }
    values.update(overrides)
    return Pool(PoolSettings(**values))  # type: ignore[arg-type]


def test_quota_messages_are_parsed() -> None:
    """The three ZeroGPU wordings become QuotaExceeded with the wait they name."""
    exceeded = quota_error(
        "You have exceeded your GPU quota (60s requested vs. 12s left). Try again in 2:05:11"
    )
    assert exceeded is not None and exceeded.retry_after_s == 2 * 3600 + 5 * 60 + 11
    assert exceeded.reason == "gpu_quota" and exceeded.kind == "quota_exceeded"
    older = quota_error("You have exceeded your GPU quota (60s requested vs. 0s left). "
                        "Please retry in 0:09:48")  # fmt: skip
    assert older is not None and older.retry_after_s == 9 * 60 + 48
    busy = quota_error("No GPU is currently available for you after 60s")
    assert busy is not None and busy.reason == "no_gpu" and busy.retry_after_s > 0
    assert quota_error("failed: GPU out of memory") is None


async def test_ip_token_per_call_and_quota_is_the_users(hub: dict[str, SpaceProcess]) -> None:
    """Two users alternate on one pooled connection: each call carries its own token only;
    A out of quota gets QuotaExceeded (parsed wait, not retried) while B is served, and the
    Space's window, breaker and connection do not move."""
    zero = hub["zero"]
    zero.reset()
    pool = _pool([zero], max_connections=1)
    try:
        a, b = {"x-ip-token": "token-A"}, {"x-ip-token": "token-B"}
        for i in range(3):
            got_a = await pool.predict("/gpu", f"a{i}", 2, headers=a)
            got_b = await pool.predict("/gpu", f"b{i}", 1, headers=b)
            assert (got_a.result, got_b.result) == (f"token-A:a{i}", f"token-B:b{i}")
        plain = await pool.predict("/gpu", "n", 0)  # no header: no token carried over
        assert plain.result == "anonymous:n"
        before = pool.board.get("zero")
        calls = zero.stats().total
        with pytest.raises(QuotaExceeded) as caught:
            await pool.predict("/gpu", "a-big", 5, headers=a, safe_to_retry=True)
        assert caught.value.retry_after_s == 65 and caught.value.reason == "gpu_quota"
        assert zero.stats().total == calls + 1  # not retried
        assert (await pool.predict("/gpu", "b-more", 1, headers=b)).result == "token-B:b-more"
        after = pool.board.get("zero")
        assert (after.window, after.failures, after.breaker) == (
            before.window, before.failures, "closed",
        )  # fmt: skip
        stats = await pool.stats()
        assert stats["pools"]["zero"]["totalConnections"] == 1
    finally:
        await pool.aclose()


async def test_config_429_retry_after_is_honoured(hub: dict[str, SpaceProcess]) -> None:
    """A Space whose /config answers 429 with Retry-After: 3 is asked once, routed around
    for the wait (calls go to the other Space), then served again."""
    limited, other = hub["limited"], hub["private"]
    other.control(require_token="")
    limited.control(config_429_s=3.0)
    limited.reset()
    pool = _pool([limited, other])
    try:
        started = time.monotonic()
        served = [
            (await pool.predict("/echo", f"x{i}", 0.05)).space for i in range(6)
        ]
        assert served.count("beta") == 6
        with pytest.raises(NoHealthySpaceError) as caught:
            await pool.predict("/echo", "pinned", 0, space="alpha")
        assert 1 <= caught.value.retry_after_s <= 3
        asked = limited.stats()
        assert asked.rate_limited == 1 and asked.config_requests == 1  # no reconnect storm
        # Served again once the wait is over: its 3 s count from the 429, which a loaded
        # machine may see a moment after ``started`` — asked again until then, each
        # answer routed around (no request to the Space).
        while True:
            try:
                done = await pool.predict("/echo", "later", 0, space="alpha")
                break
            except NoHealthySpaceError:
                assert time.monotonic() - started < 10.0, "never served again"
                await asyncio.sleep(0.1)
        assert done.result == "alpha:later"
        assert time.monotonic() - started >= 3.0
        assert limited.stats().rate_limited == 1
    finally:
        await pool.aclose()
        limited.control(config_429_s=0.0)


async def test_private_space_needs_the_token_which_is_never_shown(
    hub: dict[str, SpaceProcess], caplog: pytest.LogCaptureFixture
) -> None:
    """POOL_HF_TOKEN reaches a private Space as x-hf-authorization; without it the Space
    answers 401; the token appears in no log, stats or error."""
    private = hub["private"]
    private.control(require_token=SECRET)
    private.reset()
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    try:
        pool = _pool([private], hf_token=SECRET)
        try:
            done = await pool.predict("/echo", "hi", 0)
            assert done.result == "beta:hi"
            seen.append(json.dumps(await pool.stats()))
            seen.append(repr(pool.settings))
        finally:
            await pool.aclose()
        anonymous = _pool([private])
        try:
            with pytest.raises(UpstreamError) as caught:
                await anonymous.predict("/echo", "hi", 0)
            seen += [str(caught.value), repr(caught.value), json.dumps(await anonymous.stats())]
        finally:
            await anonymous.aclose()
        assert private.stats().unauthorized >= 1
    finally:
        private.control(require_token="")
    seen.append(caplog.text)
    assert not [text for text in seen if SECRET in text]


async def test_the_spaces_own_queue_sets_the_window(clean_fleet: SpaceFleet) -> None:
    """A Space running 2 calls at once with room for 1 waiting, beside another Space:
    12 callers are all served (no error, no hang); callers see the Space's rank; the
    window settles at <= 3 (held there, shown in pool-stats) and the Space's queue-full
    refusals stop after the first round."""
    with SpaceProcess("narrow", concurrency_limit=2, max_size=1) as narrow:
        # Anonymous callers are one consumer (issue 28): its cap out of the way here, as
        # the 12 callers of a round must reach the Space together to fill its queue.
        pool = _pool([narrow, clean_fleet["alpha"]], retry_attempts=5,
                     anonymous_max_concurrent=1000)  # fmt: skip
        seen: list[UpstreamQueued] = []

        async def note(event: UpstreamEvent) -> None:
            if isinstance(event, UpstreamQueued):
                seen.append(event)

        async def round_of(n: int) -> list[str]:
            calls = [pool.predict("/echo", f"c{i}", 0.3, on_event=note) for i in range(n)]
            async with asyncio.timeout(60):
                return [done.space for done in await asyncio.gather(*calls)]

        try:
            served: list[str] = []
            refused: list[int] = []  # the Space's queue-full answers after each round
            for _ in range(4):
                served += await round_of(12)
                refused.append(narrow.stats().refused)
            assert len(served) == 48 and {"narrow", "alpha"} <= set(served)
            health = pool.board.get("narrow")
            stats = (await pool.stats())["pools"]["narrow"]
            print("narrow: refused", refused, "window", health.window,
                  "held", stats["heldAt"], stats["spaceQueue"])  # fmt: skip
            assert health.window <= 3 and stats["heldAt"] is not None
            assert refused[-1] == refused[-2] <= 5, "refusals stopped after the first few"
            assert narrow.stats().peak <= 2
            assert any(e.queue_size for e in seen), "callers saw the Space's queue"
            assert stats["spaceQueue"] is not None
        finally:
            await pool.aclose()


def test_known_replicas_decide_what_a_restart_is() -> None:
    """An app_id seen before is no restart; one never seen is (and is known after);
    the oldest age out past KEEP."""
    replicas = Replicas()
    replicas.note("a")
    assert not replicas.is_restart("a")
    assert replicas.is_restart("b") and not replicas.is_restart("b")
    for n in range(KEEP):
        replicas.note(n)
    assert len(replicas) == KEEP and not replicas.known("a") and replicas.is_restart("a")


async def test_replicated_space_spreads_sessions_each_kept_on_its_replica(
    clean_fleet: SpaceFleet,
) -> None:
    """Two replicas (alpha, beta) behind a cookie-routing front: each upstream session
    keeps its own replica cookies, so leases and pool sessions land on both replicas
    while gr.State holds within each; health probes that reach the other replica (its
    app_id known) rebuild nothing: no /config read again, no "restarted" event."""
    alpha, beta = clean_fleet["alpha"], clean_fleet["beta"]
    front = cookie_front([alpha.url, beta.url])
    server = uvicorn.Server(uvicorn.Config(front, host="127.0.0.1", port=free_port(),
                                           log_level="warning", lifespan="off"))  # fmt: skip
    serving = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(20):
            while not server.started:
                await asyncio.sleep(0.02)
        url = f"http://127.0.0.1:{server.config.port}/"
        pool = Pool(PoolSettings(spaces=f"replicated={url}", coordinator_url="memory://",
                                 min_connections=2))  # fmt: skip
        events: list[PoolEvent] = []
        pool.hooks.append(events.append)
        try:
            await _replicas_serve_sessions(pool)
            sp = pool.spaces["replicated"]
            assert len(sp.replicas) == 2  # both app_ids known (the pool sessions met them)
            generation = sp.generation
            configs = alpha.stats().config_requests + beta.stats().config_requests
            front.loose.add("/gradio_api/app_id")  # type: ignore[attr-defined]
            before = list(front.routed)  # type: ignore[attr-defined]
            for _ in range(4):  # probes now alternate between the replicas
                await pool.health_check()
            after = front.routed  # type: ignore[attr-defined]
            assert after[0] > before[0] and after[1] > before[1]
            assert sp.generation == generation
            assert [e for e in events if e.outcome == "restarted"] == []
            assert alpha.stats().config_requests + beta.stats().config_requests == configs
        finally:
            await pool.aclose()
    finally:  # the front's proxied streams do not watch their client: no graceful wait
        server.should_exit = server.force_exit = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(serving, 2)
        await front.aclose()  # type: ignore[attr-defined]


async def _replicas_serve_sessions(pool: Pool) -> None:
    """Leases and pool sessions on a two-replica Space: each keeps its gr.State and
    stays on one replica; both replicas serve some."""
    seen: set[str] = set()

    async def lease(user: str) -> None:
        async with pool.client() as client:
            first = await client.predict(f"{user}-a", api_name="/state")
            where = await client.predict(user, 0, api_name="/echo")
            second = await client.predict(f"{user}-b", api_name="/state")
            again = await client.predict(user, 0, api_name="/echo")
        assert (first, second) == ("", f"{user}-a")
        assert where == again  # one replica for the whole session
        seen.add(where.split(":")[0])

    await asyncio.gather(*(lease(f"u{i}") for i in range(4)))
    assert seen == {"alpha", "beta"}
    seen.clear()
    for n in range(2):
        session = await pool.open_session(None)
        first = await pool.predict("/state", f"s{n}-a", session=session)
        where = await pool.predict("/echo", "x", 0, session=session)
        second = await pool.predict("/state", f"s{n}-b", session=session)
        assert (first.result, second.result) == ("", f"s{n}-a")
        seen.add(str(where.result).split(":")[0])
    assert seen == {"alpha", "beta"}
