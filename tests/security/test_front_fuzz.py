"""Property-based fuzzing of the Gradio front's JSON routes (``queue/join``,
``call/{api}``, ``cancel``) and its ``upload``: whatever JSON or bytes a caller sends,
the answer is never a 500, and the service stays healthy.

Hypothesis generates the bodies (arbitrary JSON, bodies shaped like the routes' own with
arbitrary values inside, raw bytes, multipart parts) against a real service process over
a real stand-in Space (the JSON API is fuzzed from its OpenAPI schema in
tests/service/test_fuzz.py; the front's routes are not in that schema).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devspaces import SpaceProcess
from tests.service.conftest import ServiceProcess, service_env

BASE = "/gradio/fuzzed/gradio_api"
FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=20,
)  # fmt: skip
file_like = st.fixed_dictionaries(
    {"path": st.text(max_size=40) | st.sampled_from(["/etc/hostname", "../x", "spacepool-upload/"
                                                      + "A" * 43 + "/x"]),
     "meta": st.just({"_type": "gradio.FileData"})},
    optional={"url": st.text(max_size=30), "orig_name": st.text(max_size=20)},
)  # fmt: skip
data_items = st.lists(json_values | file_like, max_size=4)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    folder = tmp_path_factory.mktemp("front-fuzz")
    with SpaceProcess("fuzzed") as space:
        started = ServiceProcess(
            service_env(f"fuzzed={space.url}", folder, POOL_SECRET_GUARD="on",
                        POOL_GRADIO_QUEUE_WAIT_S="0.5", POOL_QUEUE_TIMEOUT_S="1"),
            folder / "service.log",
        )  # fmt: skip
        yield started
        started.stop()


@pytest.fixture(scope="module")
def client(service: ServiceProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.url, timeout=30) as http:
        yield http


def _no_server_error(response: httpx.Response, sent: Any) -> None:
    """A caller's error (4xx), the Space's (502) or busy (503): never our own 500."""
    assert response.status_code < 500 or response.status_code in (502, 503), (
        response.status_code, response.text[:300], repr(sent)[:300])  # fmt: skip


@FUZZ
@given(body=json_values | st.fixed_dictionaries(
    {}, optional={"data": data_items, "fn_index": st.integers(-2, 5) | json_values,
                  "session_hash": st.text(max_size=20) | json_values,
                  "event_data": json_values, "trigger_id": json_values}))  # fmt: skip
def test_queue_join_never_answers_500(client: httpx.Client, body: Any) -> None:
    _no_server_error(client.post(f"{BASE}/queue/join", json=body), body)


@FUZZ
@given(api=st.sampled_from(["echo", "state", "fail", "nope", "..", "echo/x"]),
       body=json_values | st.fixed_dictionaries({}, optional={
           "data": data_items, "session_hash": json_values}))  # fmt: skip
def test_rest_call_never_answers_500(client: httpx.Client, api: str, body: Any) -> None:
    answer = client.post(f"{BASE}/call/{api}", json=body)
    _no_server_error(answer, body)
    if answer.status_code == 200 and "event_id" in answer.json():
        read = client.get(f"{BASE}/call/{api}/{answer.json()['event_id']}")
        _no_server_error(read, body)


@FUZZ
@given(raw=st.binary(max_size=200), kind=st.sampled_from(
    ["application/json", "text/plain", "application/x-www-form-urlencoded"]))  # fmt: skip
def test_raw_bodies_never_answer_500(client: httpx.Client, raw: bytes, kind: str) -> None:
    for path in ("queue/join", "call/echo", "cancel"):
        answer = client.post(f"{BASE}/{path}", content=raw, headers={"Content-Type": kind})
        _no_server_error(answer, raw)


@FUZZ
@given(parts=st.lists(st.tuples(st.sampled_from(["files", "other", "file"]),
                                st.text(max_size=30), st.binary(max_size=300)),
                      max_size=4))  # fmt: skip
def test_uploads_never_answer_500(
    client: httpx.Client, parts: list[tuple[str, str, bytes]]
) -> None:
    files = [(field, (name or "x", data)) for field, name, data in parts]
    answer = client.post(f"{BASE}/upload", files=files or None, data={} if files else None)
    _no_server_error(answer, parts)
    if answer.status_code == 200:
        for path in answer.json():
            assert path.startswith("spacepool-upload/"), path  # opaque, no host path
            got = client.get(f"{BASE}/file={path}")
            assert got.status_code == 200 and got.headers["x-content-type-options"] == "nosniff"


def test_the_service_is_healthy_after_the_fuzzing(client: httpx.Client) -> None:
    assert client.get("/healthz").status_code == 200
    answer = client.post("/api/predict", json={"space": "fuzzed", "api_name": "/echo",
                                               "args": ["still here", 0]})  # fmt: skip
    assert answer.status_code == 200 and answer.json()["result"] == "fuzzed:still here"
