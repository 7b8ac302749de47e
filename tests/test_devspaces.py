"""The stand-in Spaces behave like Gradio Spaces and measure what the pool does to them.

Every check goes through a real ``gradio_client.Client``: these tests pin both our
stand-ins and the gradio_client 2.7.2 behaviour the pool relies on. The streaming
kinds (``stream``, ``chat``) are the session's ``stream_spaces``. Two Spaces are
started once for the module (one costs ~0.3 s of CPU forked from the zygote, ~4 s on
its own, mostly ``import gradio``): alpha serves most tests and is reset before each;
beta is killed and restarted.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from gradio_client.utils import QueueError, Status

from devspaces import SpaceFleet, SpaceProcess, SpaceStats
from devspaces._launch import child_env

ClientFactory = Callable[[SpaceProcess], Client]


def _wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``check`` until it holds; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def fleet() -> Iterator[SpaceFleet]:
    with SpaceFleet(2) as started:
        yield started


@pytest.fixture
def alpha(fleet: SpaceFleet) -> SpaceProcess:
    space = fleet["alpha"]
    space.control(mode="ok", config_delay_s=0.0)
    space.reset()
    return space


@pytest.fixture(scope="module")
def clients(fleet: SpaceFleet) -> Iterator[list[Client]]:
    made: list[Client] = []
    yield made
    # close() waits ~1 s for the heartbeat thread: close every Client of the module at
    # once, before the fleet stops (this fixture depends on it, so it is torn down first).
    closers = [threading.Thread(target=client.close) for client in made]
    for closer in closers:
        closer.start()
    for closer in closers:
        closer.join(timeout=10)
    for client in made:
        client.executor.shutdown(wait=False)
        client.helper_executor.shutdown(wait=False)
        client.stream_executor.shutdown(wait=False)


@pytest.fixture
def connect(clients: list[Client]) -> ClientFactory:
    def factory(space: SpaceProcess) -> Client:
        client = Client(space.url, verbose=False, max_workers=4, download_files=False)
        clients.append(client)
        return client

    return factory


def test_fleet_names_ports_and_app_ids(fleet: SpaceFleet) -> None:
    """A fleet names Spaces alpha, beta; POOL_SPACES lists them; each process has its app_id."""
    alpha, beta = fleet["alpha"], fleet["beta"]
    assert fleet.pool_spaces_env() == f"alpha={alpha.url},beta={beta.url}"
    assert alpha.url.startswith("http://127.0.0.1:") and alpha.url.endswith("/")
    assert alpha.url != beta.url
    assert alpha.stats().app_id == alpha.app_id
    assert alpha.app_id != beta.app_id
    served = httpx.get(f"{alpha.url}gradio_api/app_id", trust_env=False).json()
    assert served == {"app_id": alpha.app_id}


def test_echo_returns_name_and_text(alpha: SpaceProcess, connect: ClientFactory) -> None:
    """/echo answers "<space name>:<text>" and is counted."""
    client = connect(alpha)
    assert client.config["app_id"] == alpha.app_id
    assert client.predict("hi", 0.0, api_name="/echo") == "alpha:hi"
    stats = alpha.stats()
    assert (stats.total, stats.peak, stats.in_flight) == (1, 1, 0)


def test_peak_measures_parallel_calls(alpha: SpaceProcess, connect: ClientFactory) -> None:
    """Five overlapping /echo calls show as in_flight 5 and peak 5, then drain to 0."""
    # One Client runs at most max_workers (4) predicts at once, so use two Clients.
    first, second = connect(alpha), connect(alpha)
    jobs = [first.submit(f"j{i}", 1.5, api_name="/echo") for i in range(3)]
    jobs += [second.submit(f"j{i}", 1.5, api_name="/echo") for i in range(3, 5)]
    _wait_for(lambda: alpha.stats().in_flight == 5)
    assert sorted(job.result(timeout=10) for job in jobs) == [f"alpha:j{i}" for i in range(5)]
    stats = alpha.stats()
    assert (stats.peak, stats.total, stats.in_flight) == (5, 5, 0)
    assert alpha.reset().peak == 0


def test_state_is_per_client_session(alpha: SpaceProcess, connect: ClientFactory) -> None:
    """/state returns the previous value of the same Client's session, "" for a fresh one."""
    first = connect(alpha)
    assert first.predict("a", api_name="/state") == ""
    assert first.predict("b", api_name="/state") == "a"
    second = connect(alpha)
    assert second.predict("z", api_name="/state") == ""
    assert first.predict("c", api_name="/state") == "b"


def test_fail_raises_app_error(alpha: SpaceProcess, connect: ClientFactory) -> None:
    """/fail's gr.Error reaches the caller as AppError carrying its message."""
    with pytest.raises(AppError, match="failed: boom"):
        connect(alpha).predict("boom", api_name="/fail")


def test_config_requests_count_client_constructions(
    alpha: SpaceProcess, connect: ClientFactory
) -> None:
    """Each Client construction is one GET /config; predicts add none."""
    client = connect(alpha)
    connect(alpha)
    client.predict("x", 0.0, api_name="/echo")
    assert alpha.stats().config_requests == 2


def test_queue_full_mode_raises_queue_error(alpha: SpaceProcess, connect: ClientFactory) -> None:
    """Mode queue_full answers the queue join with 503, which gradio_client raises as QueueError."""
    client = connect(alpha)
    assert alpha.control(mode="queue_full").mode == "queue_full"
    with pytest.raises(QueueError, match="Queue is full"):
        client.predict("x", 0.0, api_name="/echo")
    alpha.control(mode="ok")
    assert client.predict("x", 0.0, api_name="/echo") == "alpha:x"


def test_raise_mode_makes_echo_fail(alpha: SpaceProcess, connect: ClientFactory) -> None:
    """Mode raise makes /echo raise an AppError."""
    client = connect(alpha)
    alpha.control(mode="raise")
    with pytest.raises(AppError, match="raise mode"):
        client.predict("x", 0.0, api_name="/echo")


def test_hang_mode_holds_call_until_cancelled(alpha: SpaceProcess, connect: ClientFactory) -> None:
    """Mode hang keeps /echo in flight; cancelling the job frees it on the Space."""
    client = connect(alpha)
    alpha.control(mode="hang")
    job = client.submit("x", 0.0, api_name="/echo")
    _wait_for(lambda: alpha.stats().in_flight == 1)
    # The client names the event in its cancel: it must have read the join's answer (the
    # Space may start the call first, and a cancel without the event id cancels nothing;
    # seen on a loaded machine). PROCESSING comes after it on the client's stream.
    _wait_for(lambda: job.status().code == Status.PROCESSING)
    assert not job.done()
    job.cancel()
    _wait_for(lambda: alpha.stats().in_flight == 0)


def test_config_delay_slows_client_construction(
    alpha: SpaceProcess, connect: ClientFactory
) -> None:
    """config_delay_s delays GET /config, so constructing a Client takes at least that long."""
    alpha.control(config_delay_s=0.5)
    started = time.monotonic()
    connect(alpha)
    assert time.monotonic() - started >= 0.5
    stats = alpha.control(config_delay_s=0.0)
    assert stats.config_requests == 1


def test_control_rejects_unknown_mode(alpha: SpaceProcess) -> None:
    """The control endpoint refuses an unknown mode and keeps the current one."""
    response = httpx.post(
        f"{alpha.url}_stand_in/control", json={"mode": "sideways"}, trust_env=False
    )
    assert response.status_code == 422
    assert alpha.stats() == SpaceStats(
        name="alpha", in_flight=0, peak=0, total=0, config_requests=0,
        app_id=alpha.app_id or 0, mode="ok",
    )  # fmt: skip


def test_kill_refuses_connections_and_restart_brings_new_app_id(
    fleet: SpaceFleet, connect: ClientFactory
) -> None:
    """SIGKILL makes the URL refuse connections; restart() serves the same port, new app_id."""
    beta = fleet["beta"]
    url, old_app_id = beta.url, beta.app_id
    beta.kill()
    assert not beta.is_running()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}gradio_api/app_id", trust_env=False)
    # Restart from a thread that then ends: the child must outlive that thread.
    restarter = threading.Thread(target=beta.restart)
    restarter.start()
    restarter.join(timeout=30)
    new_app_id = beta.app_id
    assert beta.is_running()
    assert beta.url == url
    assert new_app_id != old_app_id
    assert beta.stats().app_id == new_app_id
    assert connect(beta).predict("back", 0.0, api_name="/echo") == "beta:back"


def test_stream_kind_yields_timestamped_partials_and_is_metered(
    stream_spaces: dict[str, SpaceProcess], connect: ClientFactory
) -> None:
    """Kind "stream": /stream yields 3 partials ~interval_s apart, stamped by the Space's
    clock; the meter counts the call from start to the generator's end."""
    streamer = stream_spaces["streamer"]
    streamer.reset()
    client = connect(streamer)
    started = time.time()
    job = client.submit("s", 3, 0.2, api_name="/stream")
    result = job.result(timeout=30)
    outputs = job.outputs()
    assert [o["index"] for o in outputs] == [0, 1, 2] and result == outputs[-1]
    assert outputs[-1]["text"] == "s0 s1 s2"
    stamps = [o["t"] for o in outputs]
    assert started < stamps[0] < stamps[1] < stamps[2] < time.time()
    assert all(0.15 < b - a < 1.0 for a, b in itertools.pairwise(stamps))
    assert streamer.stats().total == 1
    (start, end), = streamer.intervals()
    assert start < stamps[0] and end >= stamps[2]


def test_chat_kind_keeps_history_per_session(
    stream_spaces: dict[str, SpaceProcess], connect: ClientFactory
) -> None:
    """Kind "chat": a ChatInterface whose /chat remembers the session's earlier messages
    (gr.State) and forgets them after reset_session; /fail raises gr.Error."""
    client = connect(stream_spaces["chat"])
    assert "earlier: (nothing)" in client.predict("one", api_name="/chat")
    assert "earlier: one" in client.predict("two", api_name="/chat")
    client.reset_session()
    assert "earlier: (nothing)" in client.predict("three", api_name="/chat")
    with pytest.raises(AppError, match="failed: chat"):
        client.predict("chat", api_name="/fail")


def test_a_stand_in_does_not_take_the_services_uvicorn_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``WEB_CONCURRENCY=2 scripts/run``: the setting is the service's; a stand-in Space's
    uvicorn given it asks for workers, which it refuses (exit 3), so the demo did not
    start. Its environment leaves out WEB_CONCURRENCY and every UVICORN_* setting."""
    monkeypatch.setenv("WEB_CONCURRENCY", "2")
    monkeypatch.setenv("UVICORN_WORKERS", "2")
    monkeypatch.setenv("SPACEPOOL_KEEP_ME", "1")
    env = child_env()
    assert "WEB_CONCURRENCY" not in env and "UVICORN_WORKERS" not in env
    assert env["SPACEPOOL_KEEP_ME"] == "1"
