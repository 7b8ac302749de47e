"""No sticky sessions: a client's requests spread over the workers of a fleet.

Two service processes over the same Spaces (shapes, media) and one coordinator — an
SQLite file both read (two workers of one host), or one Redis under a private prefix
(two hosts) — with one ``POOL_FILE_DIR`` (a host's workers share it; hosts put it on
shared storage). A proxy (:mod:`._spread`) sends each request of a client to the next
worker in turn: a join to one, its data stream to the other, the heartbeat, the
upload, the ``file=`` download and the cancel each wherever their turn falls. Unmodified
gradio_client and @gradio/client must see what they see on the Space.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from gradio_client import Client, handle_file

from devspaces import SpaceFleet
from tests.admission.conftest import REDIS_URL, require_redis
from tests.service.conftest import ServiceProcess, coordinator_url, service_env

from ._spread import SpreadProxy

JS_DIR = Path(__file__).parent / "js"
pytestmark = pytest.mark.timeout(300)


class Fleet:
    """Two service processes on one coordinator, and the proxy spreading over them."""

    def __init__(self, store: str, spaces: str, folder: Path) -> None:
        self.store = store
        self.prefix = f"test-sticky-{uuid.uuid4().hex[:8]}:"
        url = (coordinator_url(folder) if store == "sqlite"
               else f"{REDIS_URL}?prefix={self.prefix}&timeout_ms=10000")  # fmt: skip
        files = folder / "files"
        self.services = []
        for i in range(2):
            env = service_env(spaces, folder, POOL_COORDINATOR_URL=url, POOL_FILE_DIR=str(files))
            self.services.append(ServiceProcess(env, _mkdir(folder / f"w{i}") / "service.log"))
        self.proxy = SpreadProxy([s.url for s in self.services]).__enter__()

    def close(self) -> None:
        for service in self.services:  # first: the streams through the proxy end
            service.stop()
        self.proxy.__exit__()
        if self.store == "redis":
            with redis.Redis.from_url(REDIS_URL) as r:
                found = list(r.scan_iter(match=f"{self.prefix}*"))
                if found:
                    r.delete(*found)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def spread(
    request: pytest.FixtureRequest, front_fleet: SpaceFleet,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:  # fmt: skip
    if request.param == "redis":
        require_redis()
    spaces = ",".join(f"{s.name}={s.url}" for s in front_fleet if s.name != "victim")
    fleet = Fleet(request.param, spaces, tmp_path_factory.mktemp(f"sticky-{request.param}"))
    yield fleet
    fleet.close()


def _client(url: str, **kw: Any) -> Client:
    return Client(url, verbose=False, download_files=kw.pop("download_files", False), **kw)


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_python_client_across_workers(spread: Fleet, front_fleet: SpaceFleet,
                                      tmp_path: Path) -> None:
    """predict, submit over a generator, gr.State over three turns, a file out and a
    file in: as on the Space, every kind of request served by both workers."""
    shapes = front_fleet["shapes"]
    direct = _client(shapes.url, download_files=str(tmp_path / "d"))
    front = _client(f"{spread.proxy.url}/gradio/shapes/", download_files=str(tmp_path / "f"))
    try:
        args = ("hi", 2, True)
        assert front.predict(*args, api_name="/multi") == direct.predict(*args, api_name="/multi")
        got = list(front.submit("ab", 3, api_name="/count"))
        assert got == list(direct.submit("ab", 3, api_name="/count")) and len(got) == 3
        chat = [front.predict(w, api_name="/history") for w in ("a", "b", "c")]
        assert chat == ["shapes:a", "shapes:a | b", "shapes:a | b | c"]
        out, want = (c.predict("lines", 3, api_name="/bundle") for c in (front, direct))
        assert out[3] == want[3] and _digest(out[0]) == _digest(want[0])  # file= downloaded
    finally:
        direct.close()
        front.close()
    upload = tmp_path / "in.bin"
    upload.write_bytes(os.urandom(5000))
    front = _client(f"{spread.proxy.url}/gradio/media/")
    try:
        for _ in range(2):  # the upload and the join on different workers, both ways
            got = front.predict(handle_file(str(upload)), api_name="/checksum")
            assert got == f"5000 {_digest(str(upload))}"
    finally:
        front.close()
    for kind in ("join", "data", "upload", "file"):
        assert spread.proxy.served(kind) == {0, 1}, (kind, spread.proxy.sent)
    assert spread.proxy.served("heartbeat"), spread.proxy.sent


def _in_flight(space: Any, busy: bool, what: str) -> None:
    deadline = time.monotonic() + 30
    while (space.stats().in_flight > 0) != busy:
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_cancel_and_close_reach_the_worker_running_the_event(
    spread: Fleet, front_fleet: SpaceFleet
) -> None:
    """A cancel sent to the other worker than the one running the event stops it at the
    Space; so does the client's close (its heartbeat on the other worker ends)."""
    shapes = front_fleet["shapes"]
    client = _client(f"{spread.proxy.url}/gradio/shapes/")
    try:
        spread.proxy.reset()
        job = client.submit("long", 10, api_name="/echo")
        _in_flight(shapes, True, "the event never started")
        job.cancel()
        _in_flight(shapes, False, "the cancelled event still runs at the Space")
        joins = [b for k, b in spread.proxy.sent if k == "join"]
        cancels = [b for k, b in spread.proxy.sent if k == "cancel"]
        assert joins[:1] == [0] and cancels[:1] == [1], spread.proxy.sent
        assert client.predict("next", 0, api_name="/echo").endswith(":next")
        client.submit("long", 10, api_name="/echo")
        _in_flight(shapes, True, "the second event never started")
    finally:
        client.close()  # the heartbeat (on the other worker) ends the session
    _in_flight(shapes, False, "the event of the closed session still runs at the Space")


def test_events_of_one_session_at_once_on_two_workers(spread: Fleet) -> None:
    """Events of one session joined at once on both workers all complete, each with its
    own output: they run on one worker (the session's runner: one upstream session has
    one data stream), the other hands its joins over."""
    client = _client(f"{spread.proxy.url}/gradio/shapes/")
    try:
        spread.proxy.reset()
        jobs = [client.submit(f"e{i}", 1.0, api_name="/echo") for i in range(4)]
        counting = client.submit("ab", 20, api_name="/count")
        got = [job.result(timeout=60) for job in jobs]
        assert [g.rsplit(":", 1)[-1] for g in got] == [f"e{i}" for i in range(4)], got
        assert counting.result(timeout=60)[0].endswith("ab" * 20)
        assert len(counting.outputs()) == 20
        assert spread.proxy.served("join") == {0, 1}, spread.proxy.sent
        chat = [client.predict(w, api_name="/history") for w in ("x", "y")]
        assert chat == ["shapes:x", "shapes:x | y"]
    finally:
        client.close()


def _latency(url: str, n: int = 10) -> float:
    client = _client(url)
    try:
        client.predict("w", 0, api_name="/echo")  # warm
        took = []
        for i in range(n):
            started = time.perf_counter()
            client.predict(f"m{i}", 0, api_name="/echo")
            took.append(time.perf_counter() - started)
        return statistics.median(took)
    finally:
        client.close()


def test_latency_spread_against_one_worker(spread: Fleet) -> None:
    """What spreading costs: a front predict's median latency through one worker and
    spread over two (printed; bounded loosely)."""
    one = _latency(f"{spread.services[0].url}/gradio/shapes/")
    two = _latency(f"{spread.proxy.url}/gradio/shapes/")
    print(f"\nfront predict median ({spread.store}): one worker {one * 1000:.0f} ms,"
          f" spread over two {two * 1000:.0f} ms")  # fmt: skip
    assert two < one + 1.0


def _node(script: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(["node", str(JS_DIR / script), *args], cwd=JS_DIR,
                          env={**os.environ, "SPACEPOOL_HEADERS": "{}"}, capture_output=True,
                          text=True, timeout=180, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(shutil.which("node") is None and not os.environ.get("CI"),
                    reason="no Node.js on this machine")  # fmt: skip
def test_gradio_js_client_across_workers(spread: Fleet, front_fleet: SpaceFleet,
                                         tmp_path: Path) -> None:
    """@gradio/client: predict, submit iteration, gr.State over three turns, file out
    and in, requests spread over the workers: as on the Space."""
    if not (JS_DIR / "node_modules" / "@gradio" / "client").is_dir():
        pytest.fail("tests/front/js/node_modules missing: scripts/test runs npm ci there")
    upload = tmp_path / "in.bin"
    upload.write_bytes(os.urandom(3000))
    base = f"{spread.proxy.url}/gradio"
    spread.proxy.reset()
    front = _node("calls.mjs", f"{base}/shapes/", f"{base}/media/", str(upload))
    direct = _node("calls.mjs", front_fleet["shapes"].url, front_fleet["media"].url,
                   str(upload))  # fmt: skip
    for key in ("multi", "partials", "chat", "text", "checksum", "fileBody"):
        assert front[key] == direct[key], key
    assert front["chat"] == ["shapes:a", "shapes:a | b", "shapes:a | b | c"]
    for kind in ("join", "data"):
        assert spread.proxy.served(kind) == {0, 1}, (kind, spread.proxy.sent)


def test_rest_call_across_workers(spread: Fleet) -> None:
    """call/{api_name}: the POST on one worker, the GET of its events on the other."""
    with httpx.Client(base_url=f"{spread.proxy.url}/gradio/shapes/", timeout=60) as http:
        posted = http.post("gradio_api/call/multi", json={"data": ["hi", 2, True]})
        assert posted.status_code == 200, posted.text
        got = http.get(f"gradio_api/call/multi/{posted.json()['event_id']}")
        assert got.status_code == 200 and "event: complete" in got.text, got.text


def _raw_event(http: httpx.Client, session_hash: str, api: str, data: list[Any]) -> Any:
    """One event by hand (``queue/join``, then the session's ``queue/data``): its output."""
    config = http.get("config").json()
    fn = next(d["id"] for d in config["dependencies"] if d.get("api_name") == api)
    body = {"session_hash": session_hash, "fn_index": fn, "data": data}
    joined = http.post("gradio_api/queue/join", json=body)
    assert joined.status_code == 200, joined.text
    event_id = joined.json()["event_id"]
    with http.stream("GET", "gradio_api/queue/data", params={"session_hash": session_hash}) as got:
        for line in got.iter_lines():
            msg = json.loads(line[5:]) if line.startswith("data:") else {}
            if msg.get("msg") == "process_completed" and msg.get("event_id") == event_id:
                assert msg["success"], msg
                return msg["output"]["data"]
    pytest.fail("the stream ended before the event completed")


def test_an_output_file_named_back_on_another_worker(spread: Fleet) -> None:
    """A Space's output file, relayed by one worker, is accepted as an input by the
    other (the trust boundary knows it fleet-wide); a made-up path is refused there."""
    session_hash = uuid.uuid4().hex
    with httpx.Client(base_url=f"{spread.proxy.url}/gradio/media/", timeout=60) as http:
        spread.proxy.reset()
        report = _raw_event(http, session_hash, "report", ["x", 3])[0]
        digest = hashlib.sha256(b"media:x\n" * 3).hexdigest()
        assert _raw_event(http, session_hash, "checksum", [report]) == [f"24 {digest}"]
        joins = [b for k, b in spread.proxy.sent if k == "join"]
        assert joins == [0, 1], spread.proxy.sent
        forged = {**report, "path": str(Path(report["path"]).parent / "other.txt")}
        config = http.get("config").json()
        fn = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "checksum")
        body = {"session_hash": session_hash, "fn_index": fn, "data": [forged]}
        refused = http.post("gradio_api/queue/join", json=body)
        assert refused.status_code == 422, refused.text


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_a_stopping_worker_ends_its_events_for_a_client_on_the_other(
    store: str, front_fleet: SpaceFleet, tmp_path: Path
) -> None:
    """The worker running an event stops (SIGTERM) while the client reads its stream on
    the other: the event ends with an error at once (not when its claim lapses), and is
    cancelled at the Space."""
    if store == "redis":
        require_redis()
    shapes = front_fleet["shapes"]
    fleet = Fleet(store, f"shapes={shapes.url}", tmp_path)
    try:
        client = _client(f"{fleet.proxy.url}/gradio/shapes/")
        try:
            fleet.proxy.reset()
            job = client.submit("long", 10, api_name="/echo")
            _in_flight(shapes, True, "the event never started")
            assert [b for k, b in fleet.proxy.sent if k == "join"] == [0], fleet.proxy.sent
            started = time.monotonic()
            fleet.services[0].stop()
            with pytest.raises(Exception, match="stopped"):
                job.result(timeout=30)
            assert time.monotonic() - started < 8.0
            _in_flight(shapes, False, "the event of the stopped worker still runs")
        finally:
            client.close()
    finally:
        fleet.close()


def _front_keys(fleet: Fleet, folder: Path) -> list[str]:
    """The front's shared values in the fleet's coordinator, but the relayed-output
    marks (they last as long as the files, POOL_FILE_TTL_S)."""
    if fleet.store == "redis":
        with redis.Redis.from_url(REDIS_URL) as r:
            keys = [k.decode() for k in r.hkeys(f"{fleet.prefix}values:gfront:")]
    else:
        with sqlite3.connect(folder / "coordinator.db") as conn:
            rows = conn.execute("SELECT key FROM shared_values WHERE ns = 'gfront:'"
                                " AND expires_at > ?", (time.time(),))  # fmt: skip
            keys = [str(k) for (k,) in rows]
    return [k for k in keys if not k.startswith("gfront:o:")]


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_nothing_of_a_closed_session_is_left_in_the_coordinator(
    store: str, front_fleet: SpaceFleet, tmp_path: Path
) -> None:
    """After the client closes, its session's messages, cancels and hand-overs are gone
    from the coordinator (not left to expire)."""
    if store == "redis":
        require_redis()
    fleet = Fleet(store, f"shapes={front_fleet['shapes'].url}", tmp_path)
    try:
        client = _client(f"{fleet.proxy.url}/gradio/shapes/")
        try:
            jobs = [client.submit(f"k{i}", 0.2, api_name="/echo") for i in range(3)]
            assert all(job.result(timeout=60).endswith(f":k{i}") for i, job in enumerate(jobs))
            cancelled = client.submit("long", 10, api_name="/echo")
            _in_flight(front_fleet["shapes"], True, "the event never started")
            cancelled.cancel()
            assert _front_keys(fleet, tmp_path), "the session left nothing while open?"
        finally:
            client.close()
        deadline = time.monotonic() + 10
        while left := _front_keys(fleet, tmp_path):
            assert time.monotonic() < deadline, left
            time.sleep(0.1)
    finally:
        fleet.close()


def test_uvicorn_workers_2(front_fleet: SpaceFleet, tmp_path: Path) -> None:
    """``--workers 2`` on one SQLite file, the kernel spreading the connections: three
    clients at once, each a predict, a submit over a generator, gr.State over three
    turns, a file out and a file in; the requests each worker served are printed."""
    spaces = ",".join(f"{s.name}={s.url}" for s in front_fleet if s.name != "victim")
    service = ServiceProcess(service_env(spaces, tmp_path), tmp_path / "service.log", workers=2)
    upload = tmp_path / "in.bin"
    upload.write_bytes(os.urandom(4000))

    def one(i: int) -> None:
        shapes = _client(f"{service.url}/gradio/shapes/", download_files=str(tmp_path / f"d{i}"))
        media = _client(f"{service.url}/gradio/media/")
        try:
            assert shapes.predict("hi", 2, True, api_name="/multi")[0] == "shapes:ih"
            assert len(list(shapes.submit("ab", 3, api_name="/count"))) == 3
            chat = [shapes.predict(f"{w}{i}", api_name="/history") for w in "abc"]
            assert chat[-1] == f"shapes:a{i} | b{i} | c{i}", chat
            bundle = shapes.predict("lines", 2, api_name="/bundle")
            assert Path(bundle[0]).read_text() == "shapes:lines\n" * 2
            got = media.predict(handle_file(str(upload)), api_name="/checksum")
            assert got == f"4000 {_digest(str(upload))}"
        finally:
            shapes.close()
            media.close()

    try:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            for done in [pool.submit(one, i) for i in range(3)]:
                done.result(timeout=120)
        served: dict[int, int] = {}
        for line in service.log_lines():
            if str(line.get("path", "")).startswith("/gradio"):
                served[line["pid"]] = served.get(line["pid"], 0) + 1
        print(f"\n--workers 2: front requests served per worker {sorted(served.values())}")
    finally:
        service.stop()
