"""Unmodified gradio_client (and @gradio/client under Node) against the Gradio front."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import ValidationError
from gradio_client.utils import QueueError

from devspaces import SpaceFleet
from tests.service.conftest import ServiceProcess, admin_headers, service_env

from .conftest import AUTH, GLOBAL_CAP

CALL_DEADLINE_S = 60.0
pytestmark = pytest.mark.timeout(300)  # the module's Spaces and services start in the first test


def _client(url: str, **kw: Any) -> Client:
    return Client(url, verbose=False, download_files=kw.pop("download_files", False), **kw)


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_alias_matches_the_space(alias_service: ServiceProcess, front_fleet: SpaceFleet,
                                 tmp_path: Path) -> None:
    """predict, submit over a generator, view_api, file in and out: as on the Space."""
    shapes = front_fleet["shapes"]
    direct = _client(shapes.url, download_files=str(tmp_path / "d"))
    front = _client(f"{alias_service.url}/gradio/shapes/", download_files=str(tmp_path / "f"),
                    headers=AUTH)
    try:
        assert front.view_api(return_format="dict", print_info=False) == direct.view_api(
            return_format="dict", print_info=False
        )
        args = ("hi", 2, True)
        assert front.predict(*args, api_name="/multi") == direct.predict(*args, api_name="/multi")
        outputs = [list(front.submit("ab", 3, api_name="/count"))]
        outputs.append(list(direct.submit("ab", 3, api_name="/count")))
        assert outputs[0] == outputs[1] and len(outputs[0]) == 3
        got, want = (c.predict("lines", 3, api_name="/bundle") for c in (front, direct))
        assert got[3] == want[3] and _digest(got[0]) == _digest(want[0])
    finally:
        direct.close()
        front.close()
    media = front_fleet["media"]
    upload = tmp_path / "in.bin"
    upload.write_bytes(os.urandom(5000))
    direct = _client(media.url)
    front = _client(f"{alias_service.url}/gradio/media/", headers=AUTH)
    try:
        sums = [c.predict(handle_file(str(upload)), api_name="/checksum") for c in (front, direct)]
        assert sums[0] == sums[1] == f"5000 {_digest(str(upload))}"
    finally:
        direct.close()
        front.close()


def test_output_urls_name_the_service(alias_service: ServiceProcess, front_fleet: SpaceFleet,
                                      tmp_path: Path) -> None:
    """A file output's URL is the service's; the API token is required."""
    refused = httpx.get(f"{alias_service.url}/gradio/shapes/config", timeout=30)
    assert refused.status_code == 401
    front = _client(f"{alias_service.url}/gradio/shapes/", headers=AUTH)
    try:
        result = front.predict("x", 2, api_name="/bundle")
    finally:
        front.close()
    data = result[0]
    assert isinstance(data, dict) and data["url"].startswith(f"{alias_service.url}/gradio/shapes/")
    assert str(front_fleet["shapes"].url).rstrip("/") not in str(result)


def _chat(client: Client, words: list[str]) -> list[str]:
    return [client.predict(w, api_name="/state") for w in words]


def test_state_chat_and_isolation(pool_service: ServiceProcess) -> None:
    """gr.State over three turns as on the Space; two sessions never see each other's."""
    one = _client(f"{pool_service.url}/gradio/", headers={"X-Spacepool-User": "a@example.com"})
    two = _client(f"{pool_service.url}/gradio/")
    try:
        assert _chat(one, ["a1", "a2"]) == ["", "a1"]
        assert _chat(two, ["b1", "b2"]) == ["", "b1"]
        assert _chat(one, ["a3"]) == ["a2"]
        assert _chat(two, ["b3"]) == ["b2"]
    finally:
        one.close()
        two.close()


def _wait_in_flight(spaces: list[Any], more_than_zero: bool, what: str) -> None:
    deadline = time.monotonic() + 30
    while (sum(s.stats().in_flight for s in spaces) > 0) != more_than_zero:
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_cancel_reaches_the_space(pool_service: ServiceProcess, fleet: SpaceFleet,
                                  front_fleet: SpaceFleet) -> None:
    """job.cancel() through the front stops the event at the Space; the session goes on."""
    spaces = [*fleet, front_fleet["victim"]]
    client = _client(f"{pool_service.url}/gradio/")
    try:
        job = client.submit("long", 60, api_name="/echo")
        _wait_in_flight(spaces, True, "the event never started")
        job.cancel()
        _wait_in_flight(spaces, False, "the event still runs at the Space")
        assert client.predict("next", 0, api_name="/echo").endswith(":next")
    finally:
        client.close()


def test_closed_session_frees_its_slots(pool_service: ServiceProcess, fleet: SpaceFleet,
                                        front_fleet: SpaceFleet) -> None:
    """A client that closes (its heartbeat ends) has its running event cancelled at the
    Space and its slots freed."""
    spaces = [*fleet, front_fleet["victim"]]
    client = _client(f"{pool_service.url}/gradio/")
    client.submit("long", 60, api_name="/echo")
    _wait_in_flight(spaces, True, "the event never started")
    client.close()
    _wait_in_flight(spaces, False, "the event still runs at the Space")
    stats = httpx.get(f"{pool_service.url}/api/admin/pool-stats", headers=admin_headers()).json()
    assert stats["inUseConnections"] == 0


def _one_call(url: str, i: int) -> str:
    # A generous deadline per request (httpx's default is 5 s): the machine may be loaded.
    client = _client(url, httpx_kwargs={"timeout": CALL_DEADLINE_S})
    try:
        job = client.submit(f"c{i}", 0.3, api_name="/echo")
        return str(job.result(timeout=CALL_DEADLINE_S))
    except QueueError:
        return "busy"
    finally:
        client.close()


def test_events_of_one_session_run_at_once(pool_service: ServiceProcess, fleet: SpaceFleet,
                                           front_fleet: SpaceFleet) -> None:
    """Two submits of one client (one session: the anonymous consumer's cap) run at the
    Space together, each with its own result: their leases share the upstream
    session's one data stream."""
    spaces = [*fleet, front_fleet["victim"]]
    client = _client(f"{pool_service.url}/gradio/")
    try:
        jobs = [client.submit(f"p{i}", 3, api_name="/echo") for i in range(2)]
        deadline = time.monotonic() + 30
        while sum(s.stats().in_flight for s in spaces) < 2:
            assert time.monotonic() < deadline, "the two events never ran together"
            time.sleep(0.05)
        results = [str(job.result(timeout=CALL_DEADLINE_S)) for job in jobs]
    finally:
        client.close()
    assert [r.split(":", 1)[1] for r in results] == ["p0", "p1"]
    assert len({r.split(":", 1)[0] for r in results}) == 1  # one Space: the session's


def test_thirty_clients_cap_holds(pool_service: ServiceProcess, fleet: SpaceFleet,
                                  front_fleet: SpaceFleet) -> None:
    """30 clients at once, global cap 4: at most 4 run at the Spaces; each call ends."""
    spaces = SpaceFleet.__new__(SpaceFleet)
    spaces.spaces = [*fleet, front_fleet["victim"]]
    for space in spaces:
        space.reset()
    url = f"{pool_service.url}/gradio/"
    with concurrent.futures.ThreadPoolExecutor(30) as pool:
        results = list(pool.map(lambda i: _one_call(url, i), range(30), timeout=120))
    done = [r for r in results if r != "busy"]
    assert all(r.split(":", 1)[1].startswith("c") for r in done)
    assert len(done) >= GLOBAL_CAP
    assert spaces.concurrent_peak() <= GLOBAL_CAP


def test_killed_space_fails_over(pool_service: ServiceProcess, front_fleet: SpaceFleet) -> None:
    """The session's Space dies mid-call: that call errors, the next one runs elsewhere
    with fresh state."""
    victim = front_fleet["victim"]
    url = f"{pool_service.url}/gradio/"
    for i in range(8):  # a session that landed on the victim (users are spread round-robin)
        client = _client(url, headers={"X-Spacepool-User": f"k{i}@example.com"})
        before = victim.stats().total
        assert _chat(client, ["v1"]) == [""]
        if victim.stats().total > before:
            break
        client.close()
    else:
        pytest.skip("no session landed on the victim")
    try:
        job = client.submit("slow", 30, api_name="/echo")
        # Killed once the call runs there: before, its join would be refused, and a
        # refused join is repeated elsewhere by the pool's retry policy (never accepted).
        _wait_in_flight([victim], True, "the call never started on the victim")
        victim.kill()
        started = time.monotonic()
        with pytest.raises(Exception):  # noqa: B017 (an error, whichever the client raises)
            job.result(timeout=CALL_DEADLINE_S)
        assert time.monotonic() - started < 30
        assert _chat(client, ["v2", "v3"]) == ["", "v2"]  # elsewhere, state lost
    finally:
        client.close()


JS_DIR = Path(__file__).parent / "js"


def _node(*args: str) -> dict[str, Any]:
    env = {**os.environ, "SPACEPOOL_HEADERS": json.dumps(AUTH)}
    done = subprocess.run(["node", str(JS_DIR / "calls.mjs"), *args], cwd=JS_DIR, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(shutil.which("node") is None, reason="no Node.js on this machine")
def test_gradio_js_client(alias_service: ServiceProcess, front_fleet: SpaceFleet,
                          tmp_path: Path) -> None:
    """@gradio/client: predict, submit iteration, gr.State over three turns, handle_file,
    file output: as on the Space."""
    if not (JS_DIR / "node_modules" / "@gradio" / "client").is_dir():
        pytest.fail("tests/front/js/node_modules missing: scripts/test runs npm ci there")
    upload = tmp_path / "in.bin"
    upload.write_bytes(os.urandom(3000))
    base = f"{alias_service.url}/gradio"
    front = _node(f"{base}/shapes/", f"{base}/media/", str(upload))
    direct = _node(front_fleet["shapes"].url, front_fleet["media"].url, str(upload))
    for key in ("multi", "partials", "chat", "text", "checksum", "fileBody"):
        assert front[key] == direct[key], key
    assert front["chat"] == ["shapes:a", "shapes:a | b", "shapes:a | b | c"]  # gr.State
    assert len(front["partials"]) >= 3  # each partial, then the final output
    assert front["checksum"] == [f"3000 {_digest(str(upload))}"]
    assert front["fileUrl"].startswith(f"{base}/shapes/gradio_api/file=")


def _rest(base: str, api: str, data: list[Any], headers: dict[str, str]) -> list[tuple[str, Any]]:
    with httpx.Client(base_url=base, headers=headers, timeout=CALL_DEADLINE_S) as http:
        posted = http.post(f"gradio_api/call/{api}", json={"data": data})
        assert posted.status_code == 200, posted.text
        events, kind = [], ""
        with http.stream("GET", f"gradio_api/call/{api}/{posted.json()['event_id']}") as got:
            for line in got.iter_lines():
                if line.startswith("event:"):
                    kind = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and kind != "heartbeat":
                    events.append((kind, json.loads(line.split(":", 1)[1])))
    return events


def test_rest_call_form(alias_service: ServiceProcess, front_fleet: SpaceFleet) -> None:
    """call/{api_name}: the same events (generating outputs whole, then complete)."""
    front_base = f"{alias_service.url}/gradio/shapes/"
    for api, data in (("multi", ["hi", 2, True]), ("count", ["ab", 3])):
        got = _rest(front_base, api, data, AUTH)
        want = _rest(front_fleet["shapes"].url, api, data, {})
        assert got == want and got[-1][0] == "complete"


def test_bad_requests_are_answered(alias_service: ServiceProcess) -> None:
    """What a caller can send wrong is a 4xx, never a 500; no file of the service leaks."""
    base = f"{alias_service.url}/gradio"
    with httpx.Client(headers=AUTH, timeout=CALL_DEADLINE_S) as http:
        assert http.get(f"{base}/nowhere/config").status_code == 422
        join = f"{base}/media/gradio_api/queue/join"
        assert http.post(join, content=b"{not json").status_code == 400
        assert http.post(join, json={"fn_index": 0, "data": []}).status_code == 400
        body = {"session_hash": "s1", "fn_index": 999, "data": []}
        assert http.post(join, json=body).status_code == 422
        config = http.get(f"{base}/media/config").json()
        fn = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "checksum")
        stolen = {"path": "/etc/hostname", "meta": {"_type": "gradio.FileData"}}
        body = {"session_hash": "s1", "fn_index": fn, "data": [stolen]}
        refused = http.post(join, json=body)
        assert refused.status_code == 422
        # As Gradio's validators answer a join: a list the clients read.
        [problem] = refused.json()["detail"]
        assert problem["__type__"] == "validate" and problem["is_valid"] is False
        assert problem["parameter_name"] == "data[0]" and "uploaded" in problem["message"]
    front = _client(f"{alias_service.url}/gradio/media/", headers=AUTH)
    try:  # gradio_client shows the refusal as a ValidationError naming the input
        with pytest.raises(ValidationError, match=r"data\[0\]"):
            front.predict(handle_file("https://files.invalid/in.bin"), api_name="/checksum")
    finally:
        front.close()


def test_a_stop_signal_ends_endless_streams_and_the_service_stops_at_once(
    front_fleet: SpaceFleet, tmp_path: Path
) -> None:
    """A heartbeat stream never ends by itself, nor does an idle data stream a client keeps
    open; SIGTERM ends both (app/core/_draining.py: the data stream with ``close_stream``, so
    that the client opens a new one at its next event) and the service stops without
    waiting for them — the harness's uvicorn has no --timeout-graceful-shutdown: without
    that it would wait until killed."""
    shapes = front_fleet["shapes"]
    service = ServiceProcess(
        service_env(f"shapes={shapes.url}", tmp_path), tmp_path / "service.log"
    )
    client = _client(f"{service.url}/gradio/shapes/")  # its own heartbeat thread too
    api = f"{service.url}/gradio/shapes/gradio_api"
    hashed = client.session_hash
    try:
        assert client.predict("hi", 2, True, api_name="/multi")[0] == "shapes:ih"
        with (
            httpx.stream("GET", f"{api}/heartbeat/{hashed}", timeout=20) as beats,
            httpx.stream("GET", f"{api}/queue/data", params={"session_hash": hashed},
                         timeout=20) as idle,  # fmt: skip
        ):
            assert idle.status_code == 200
            beat_lines = beats.iter_lines()
            assert next(beat_lines) == "data: ALIVE"  # the stream is open
            began = time.monotonic()
            service.proc.send_signal(signal.SIGTERM)
            rest: dict[str, list[str]] = {"beats": [], "data": []}
            for name, lines in (("beats", beat_lines), ("data", idle.iter_lines())):
                for line in lines:  # ends when the service drains
                    rest[name].append(line)
                    assert time.monotonic() - began < 10.0, f"{name} went on: {rest}"
            ended_s = time.monotonic() - began
        code = service.proc.wait(timeout=20)
        stopped_s = time.monotonic() - began
        print(f"\nstreams ended {ended_s:.2f} s, process {stopped_s:.2f} s after SIGTERM")
        assert all(line in ("", "data: ALIVE") for line in rest["beats"]), rest
        data = [json.loads(line[5:]) for line in rest["data"] if line.startswith("data:")]
        assert data[-1:] == [{"msg": "close_stream"}], rest
        # uvicorn raises the signal again once it has shut down (Server.capture_signals)
        assert code in (0, -signal.SIGTERM), service.log_text()[-2000:]
        assert stopped_s < 5.0, stopped_s
    finally:
        client.close()
        service.stop()
