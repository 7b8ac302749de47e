"""The front queues like a Gradio server (issue 30, items 1–3).

Joins are answered at once and the events wait in the pool's queue with ``estimation``
messages (unmodified gradio_client and @gradio/client, the cap counted on the Spaces'
own clock); a Space's full queue refuses one event, never the session's others; what a
client sends beside ``data`` reaches the Space; heartbeats come at the Space's cadence;
a full front queue is the join's 503.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from gradio_client.utils import Status

from devspaces import SpaceProcess
from tests.service.conftest import ServiceProcess, service_env

from .test_front import JS_DIR

pytestmark = pytest.mark.timeout(300)
CAP = 3  # the service's global cap
CLIENTS = 12
QUEUE_MAX = 12  # POOL_GRADIO_QUEUE_MAX_SIZE
BEAT_S = 0.25  # the Spaces' GRADIO_HEARTBEAT_INTERVAL (the front's default: 1 s)
QUEUE_TIMEOUT_S = 15.0  # POOL_QUEUE_TIMEOUT_S (12 clients of 1 s need ~4 s)
DEADLINE_S = 90.0


@pytest.fixture(scope="module")
def spaces() -> Iterator[dict[str, SpaceProcess]]:
    """steady (echo), narrow (echo, one at a time, queue max_size=1: the ZeroGPU
    default), shower (headers kind: shows the call's event_data); all beating every
    BEAT_S."""
    before = os.environ.get("GRADIO_HEARTBEAT_INTERVAL")
    os.environ["GRADIO_HEARTBEAT_INTERVAL"] = str(BEAT_S)  # the children's environment
    started: dict[str, SpaceProcess] = {}
    try:
        for name, kw in (("steady", {}), ("narrow", {"concurrency_limit": 1, "max_size": 1}),
                         ("shower", {"kind": "headers"})):  # fmt: skip
            started[name] = SpaceProcess(name, wait=False, startup_timeout_s=150, **kw)
        for space in started.values():
            space.wait_ready()
    finally:
        if before is None:
            os.environ.pop("GRADIO_HEARTBEAT_INTERVAL", None)
        else:
            os.environ["GRADIO_HEARTBEAT_INTERVAL"] = before
    yield started
    for space in started.values():
        space.stop()


@pytest.fixture(scope="module")
def service(
    spaces: dict[str, SpaceProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    folder = tmp_path_factory.mktemp("front-queueing")
    env = service_env(",".join(f"{n}={s.url}" for n, s in spaces.items()), folder,
                      POOL_GLOBAL_MAX_CONCURRENT=str(CAP), POOL_CONSUMER_MAX_CONCURRENT=str(CAP),
                      POOL_GRADIO_QUEUE_MAX_SIZE=str(QUEUE_MAX),
                      POOL_QUEUE_TIMEOUT_S=str(QUEUE_TIMEOUT_S),
                      POOL_GRADIO_QUEUE_WAIT_S="2.5")  # obsolete: accepted, ignored  # fmt: skip
    started = ServiceProcess(env, folder / "service.log")
    yield started
    started.stop()


def _peak(space: SpaceProcess) -> int:
    """The most calls the Space ran at one moment, from the intervals it recorded."""
    events = sorted((t, d) for s, e in space.intervals() for t, d in ((s, 1), (e, -1)))
    peak = running = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def _settled(space: SpaceProcess) -> None:
    """Wait until the Space runs nothing (a test before may have left calls running),
    then reset its counts."""
    deadline = time.monotonic() + DEADLINE_S
    while space.stats().in_flight:
        assert time.monotonic() < deadline, space.stats()
        time.sleep(0.05)
    space.reset()


def _holding(http: httpx.Client, fn: int, what: str, delay_s: float) -> None:
    """Take the whole cap with CAP events of ``delay_s`` (raw joins, sessions of their
    own) and return once the Space runs them."""
    for i in range(CAP):
        got = http.post("queue/join", json={"data": [f"{what}{i}", delay_s], "fn_index": fn,
                                            "session_hash": f"{what}{i}"})  # fmt: skip
        assert got.status_code == 200, got.text


def _echo_fn(http: httpx.Client) -> int:
    config = http.get("../config").json()
    return int(next(d["id"] for d in config["dependencies"] if d.get("api_name") == "echo"))


def _running(space: SpaceProcess, count: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while space.stats().in_flight < count:
        assert time.monotonic() < deadline, space.stats()
        time.sleep(0.05)


def _falling(positions: list[list[int]]) -> None:
    """Each client's queue positions (Gradio's rank: 0 is next) never rise until it is
    next; those that waited behind a whole round of the cap (CAP or more ahead) saw
    theirs fall. (Once admitted, the Space's own ``estimation`` is relayed: its rank
    among the events joined at once there may be 1 or 2 again.)"""
    shown = repr(positions)
    positions = [p[: p.index(0) + 1] if 0 in p else p for p in positions]
    assert all(p == sorted(p, reverse=True) for p in positions), shown
    waited = [p for p in positions if p and p[0] >= CAP]
    assert len(waited) >= CLIENTS - 3 * CAP, shown
    assert all(len(p) >= 2 and p[-1] < p[0] for p in waited), shown


def _python_client(url: str, i: int) -> tuple[str, list[int]]:
    """One unmodified gradio_client client (the default 5 s join timeout): its result
    and the queue ranks its job's status showed, in order."""
    client = Client(url, verbose=False, headers={"X-Spacepool-User": f"py{i}@example.com"})
    try:
        job = client.submit(f"p{i}", 1, api_name="/echo")
        ranks: list[int] = []
        while not job.done():
            status = job.status()
            rank = status.rank if status.code == Status.IN_QUEUE else None
            if rank is not None and (not ranks or ranks[-1] != rank):
                ranks.append(rank)
            time.sleep(0.02)
        return str(job.result(timeout=DEADLINE_S)), ranks
    finally:
        client.close()


def test_twelve_clients_wait_in_the_pools_queue(
    service: ServiceProcess, spaces: dict[str, SpaceProcess]
) -> None:
    """12 clients, a 1 s endpoint, a cap of 3: every one served (none busy after 2.5 s
    as the held join did), at most 3 at once at the Space, ranks falling meanwhile."""
    steady = spaces["steady"]
    _settled(steady)
    url = f"{service.url}/gradio/steady/"
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        runs = list(pool.map(lambda i: _python_client(url, i), range(CLIENTS), timeout=120))
    took = time.monotonic() - started
    assert [r for r, _ in runs] == [f"steady:p{i}" for i in range(CLIENTS)]
    assert _peak(steady) == CAP, steady.intervals()
    _falling([ranks for _, ranks in runs])
    print(f"gradio_client: {CLIENTS} served in {took:.1f} s (clients' connect included),"
          f" ranks {[ranks for _, ranks in runs]}")  # fmt: skip


@pytest.mark.skipif(shutil.which("node") is None, reason="no Node.js on this machine")
def test_twelve_js_clients_wait_in_the_pools_queue(
    service: ServiceProcess, spaces: dict[str, SpaceProcess]
) -> None:
    """The same with @gradio/client: its "pending" statuses carry the falling position."""
    if not (JS_DIR / "node_modules" / "@gradio" / "client").is_dir():
        pytest.fail("tests/front/js/node_modules missing: scripts/test runs npm ci there")
    steady = spaces["steady"]
    _settled(steady)
    done = subprocess.run(
        ["node", str(JS_DIR / "queue.mjs"), f"{service.url}/gradio/steady/", str(CLIENTS), "1"],
        cwd=JS_DIR, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    runs: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["result"] for r in runs] == [f"steady:j{i}" for i in range(CLIENTS)]
    assert _peak(steady) == CAP, steady.intervals()
    _falling([r["positions"] for r in runs])
    print("@gradio/client positions:", [r["positions"] for r in runs])


def test_a_full_space_queue_refuses_one_event_not_the_session(
    service: ServiceProcess, spaces: dict[str, SpaceProcess]
) -> None:
    """One client, three submits at once on a Space that runs one event and queues one
    (Gradio's ``max_size=1``): its 503 for the third puts that event back in the pool's
    queue; all three succeed, in one upstream session, and the session goes on."""
    narrow = spaces["narrow"]
    _settled(narrow)
    client = Client(f"{service.url}/gradio/narrow/", verbose=False)
    try:
        jobs = [client.submit(f"n{i}", 1, api_name="/echo") for i in range(3)]
        assert [j.result(timeout=DEADLINE_S) for j in jobs] == [f"narrow:n{i}" for i in range(3)]
        assert narrow.stats().refused >= 1  # the Space's own queue did refuse one
        assert client.predict("after", 0, api_name="/echo") == "narrow:after"
    finally:
        client.close()
    assert _peak(narrow) == 1


def _event_data(url: str, sent: dict[str, Any], **kw: Any) -> Any:
    """gradio_client's ``test_client_forwards_event_data`` shape: the endpoint's
    end-to-end function called with an ``event_data`` beside the data."""
    client = Client(url, verbose=False, **kw)
    try:
        fn = client._infer_fn_index("/event_data", None)
        helper = client.new_helper(fn)
        return client.endpoints[fn].make_end_to_end_fn(helper)("t", event_data=sent)
    finally:
        client.close()


def test_event_data_reaches_the_space(
    service: ServiceProcess, spaces: dict[str, SpaceProcess]
) -> None:
    sent = {"foo": "bar", "baz": 123}
    direct = _event_data(spaces["shower"].url, sent)
    front = _event_data(f"{service.url}/gradio/shower/", sent)
    assert direct == front == {"text": "t", "event_data": sent}
    # A field of the wrong type is the join's 422, not the Space's failure.
    with httpx.Client(base_url=f"{service.url}/gradio/shower/gradio_api/", timeout=30) as http:
        config = http.get("../config").json()
        fn = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "event_data")
        bad = http.post("queue/join", json={"data": ["t"], "fn_index": fn,
                                            "session_hash": "typed", "trigger_id": "one"})
        assert bad.status_code == 422, bad.text


def _beats(url: str, count: int) -> list[float]:
    """The gaps between the first ``count`` lines of a heartbeat stream."""
    seen: list[float] = []
    with httpx.Client(timeout=30) as http, http.stream("GET", url) as beats:
        for line in beats.iter_lines():
            if line.startswith("data:"):
                seen.append(time.monotonic())
            if len(seen) == count:
                break
    return [b - a for a, b in itertools.pairwise(seen)]


def test_heartbeats_come_at_the_spaces_cadence(
    service: ServiceProcess, spaces: dict[str, SpaceProcess]
) -> None:
    """The front's heartbeat stream beats as often as the Space's (every BEAT_S here,
    15 s by default): as the pool measured it on the Space's streams (steady: its
    events' data streams carried beats), or measures it then (shower: its instant
    events never showed one)."""
    base = f"{service.url}/gradio/steady/"
    client = Client(base, verbose=False)
    try:
        assert client.predict("warm", 2 * BEAT_S + 0.5, api_name="/echo") == "steady:warm"
    finally:
        client.close()
    gaps = _beats(f"{base}gradio_api/heartbeat/beating", 6)
    assert statistics.median(gaps) < 2.5 * BEAT_S, gaps
    # shower: unknown until now; beats every second meanwhile, then at its cadence.
    gaps = _beats(f"{service.url}/gradio/shower/gradio_api/heartbeat/measuring", 10)
    assert max(gaps) < 1.5 and statistics.median(gaps[-4:]) < 2.5 * BEAT_S, gaps


def test_a_full_front_queue_is_the_joins_503(
    service: ServiceProcess, spaces: dict[str, SpaceProcess]
) -> None:
    """With the cap taken, POOL_GRADIO_QUEUE_MAX_SIZE joins are queued and the next get
    Gradio's full-queue answer (503, Retry-After; gradio_client's QueueError); every
    queued one is served once the cap frees."""
    steady = spaces["steady"]
    _settled(steady)
    with httpx.Client(base_url=f"{service.url}/gradio/steady/gradio_api/", timeout=30) as http:
        fn = _echo_fn(http)
        _holding(http, fn, "fullhold", 2)
        _running(steady, CAP)
        answers = [http.post("queue/join", json={"data": [f"f{i}", 0], "fn_index": fn,
                                                 "session_hash": f"full{i}"})
                   for i in range(QUEUE_MAX + 2)]  # fmt: skip
        codes = [a.status_code for a in answers]
        assert codes == [200] * QUEUE_MAX + [503] * 2, codes
        assert all("Queue is full" in b.json()["detail"] and "retry-after" in b.headers
                   for b in answers[QUEUE_MAX:])  # fmt: skip
        for i in range(QUEUE_MAX):  # each queued event completes (its session's stream)
            with http.stream("GET", "queue/data", params={"session_hash": f"full{i}"}) as got:
                msgs = [json.loads(line[5:]) for line in got.iter_lines()
                        if line.startswith("data:")]  # fmt: skip
            done = [m for m in msgs if m.get("msg") == "process_completed"]
            assert done and done[0]["success"], msgs
            assert done[0]["output"]["data"] == [f"steady:f{i}"]
    _settled(steady)


def test_a_waiting_event_cancelled_never_runs(
    service: ServiceProcess, spaces: dict[str, SpaceProcess]
) -> None:
    """``cancel`` of an event still in the pool's queue ends it as a Space ends a
    cancelled one (completed, empty) and it never reaches the Space; the others run."""
    steady = spaces["steady"]
    _settled(steady)
    with httpx.Client(base_url=f"{service.url}/gradio/steady/gradio_api/", timeout=30) as http:
        fn = _echo_fn(http)
        _holding(http, fn, "cancelhold", 2)  # the cap taken for 2 s
        got = http.post("queue/join", json={"data": ["never", 0], "fn_index": fn,
                                            "session_hash": "cancelled"})  # fmt: skip
        assert got.status_code == 200, got.text
        waiting = got.json()["event_id"]
        with http.stream("GET", "queue/data", params={"session_hash": "cancelled"}) as got:
            msgs: list[dict[str, Any]] = []
            for line in got.iter_lines():
                if not line.startswith("data:"):
                    continue
                msgs.append(json.loads(line[5:]))
                if msgs[-1]["msg"] == "estimation":  # it waits: cancel it
                    assert http.post("cancel", json={"session_hash": "cancelled",
                                                     "event_id": waiting,
                                                     "fn_index": fn}).status_code == 200
    kinds = [m["msg"] for m in msgs]
    assert kinds[0] == "estimation" and kinds[-1] == "close_stream", kinds
    done = [m for m in msgs if m["msg"] == "process_completed"]
    assert done == [{"msg": "process_completed", "event_id": waiting, "success": True,
                     "output": {}}], msgs  # fmt: skip
    deadline = time.monotonic() + 30
    while steady.stats().total < CAP or steady.stats().in_flight:
        assert time.monotonic() < deadline, steady.stats()
        time.sleep(0.05)
    time.sleep(1.0)  # the freed slots: nothing else was admitted
    assert steady.stats().total == CAP


def test_an_event_waiting_too_long_fails_as_gradio_fails_one(
    service: ServiceProcess, spaces: dict[str, SpaceProcess]
) -> None:
    """Past POOL_QUEUE_TIMEOUT_S in the pool's queue, the event ends with a
    ``process_completed`` error carrying the busy message (gradio_client: AppError);
    its session and the events that ran are untouched."""
    steady = spaces["steady"]
    _settled(steady)
    hog = {"X-Spacepool-User": "hog@example.com"}
    holding = Client(f"{service.url}/gradio/steady/", verbose=False, headers=hog)
    late = Client(f"{service.url}/gradio/steady/", verbose=False, headers=hog)
    try:
        held = [holding.submit(f"h{i}", QUEUE_TIMEOUT_S + 2, api_name="/echo")
                for i in range(CAP)]  # fmt: skip
        _running(steady, CAP)
        started = time.monotonic()
        with pytest.raises(AppError, match="Queue is full"):
            late.predict("late", 0, api_name="/echo")
        waited = time.monotonic() - started
        assert QUEUE_TIMEOUT_S - 1 <= waited < QUEUE_TIMEOUT_S + 10, waited
        assert [j.result(timeout=DEADLINE_S) for j in held] == [
            f"steady:h{i}" for i in range(CAP)
        ]
        assert late.predict("again", 0, api_name="/echo") == "steady:again"
    finally:
        holding.close()
        late.close()
