"""Traces (issue 32): one predict through the service, recorded by the OpenTelemetry
SDK's in-memory exporter, is one trace under the caller's ``traceparent`` with the
pool's steps as spans, and no attribute carries an email, a token or a payload.

The service runs in this process (its lifespan, httpx's ASGI transport) over a real
"headers" stand-in Space, which says what ``traceparent`` reached it.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.core._settings import ServiceSettings
from devspaces import SpaceProcess, free_port
from pool import Pool, PoolSettings, set_pool
from pool._trace import use_provider

from .conftest import ADMIN_TOKEN, admin_headers

EMAIL = "secret.person@example.com"
PAYLOAD = "PAYLOAD-" + secrets.token_hex(4)
TRACE_ID = secrets.token_hex(16)
PARENT_ID = secrets.token_hex(8)


@pytest.fixture(scope="module")
def traced_space() -> Iterator[SpaceProcess]:
    """A "headers" stand-in: /copy (a file in and out), /headers (what reached it)."""
    with SpaceProcess("traced", kind="headers") as space:
        yield space


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """An SDK provider with the in-memory exporter, for the pool's spans (this test only)."""
    provider = TracerProvider()
    found = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(found))
    use_provider(provider)
    try:
        yield found
    finally:
        use_provider(None)
        provider.shutdown()


@pytest.fixture
async def service(traced_space: SpaceProcess) -> AsyncIterator[httpx.AsyncClient]:
    """The service in this process over the "headers" Space and a dead one."""
    from app.main import create_app

    dead = f"dead=http://127.0.0.1:{free_port()}/"
    set_pool(Pool(PoolSettings(
        spaces=f"traced={traced_space.url},{dead}", coordinator_url="memory://",
        queue_timeout_s=10.0, retry_backoff_s=0.01,
    )))  # fmt: skip
    app = create_app(ServiceSettings(admin_token=ADMIN_TOKEN))
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://svc",
                                         timeout=60) as http:  # fmt: skip
                yield http
    finally:
        set_pool(None)


def _attrs(spans: list[ReadableSpan]) -> str:
    return repr([(s.name, dict(s.attributes or {}), [dict(e.attributes or {}) for e in s.events])
                 for s in spans])  # fmt: skip


async def test_one_predict_is_one_trace_under_the_callers_traceparent(
    service: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    """A keyed predict with a file in and out: the server span's parent is the caller's
    span; admission, checkout, the Space call with upload, queue and run, and the
    download are its descendants in the same trace, named with the Space, api_name,
    outcome and key; the Space received this trace's traceparent; no attribute holds
    the email, the key or the payload."""
    created = await service.post("/api/admin/keys", headers=admin_headers(),
                                 json={"name": "traced-team", "max_concurrent": 2})  # fmt: skip
    key = created.json()["key"]
    headers = {"Authorization": f"Bearer {key}",
               "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}  # fmt: skip
    data = base64.b64encode(PAYLOAD.encode()).decode()
    body: dict[str, Any] = {"api_name": "/copy", "space": "traced", "email": EMAIL,
                            "args": [{"file": {"b64": data, "name": "in.txt"}}]}  # fmt: skip
    copied = await service.post("/api/predict", json=body, headers=headers)
    assert copied.status_code == 200, copied.text
    said = await service.post("/api/predict", headers=headers, json={
        "api_name": "/headers", "space": "traced", "args": [PAYLOAD, 0], "email": EMAIL})
    assert said.status_code == 200, said.text
    spans = exporter.get_finished_spans()
    mine = [s for s in spans if s.context.trace_id == int(TRACE_ID, 16)]
    by_name: dict[str, list[ReadableSpan]] = {}
    for s in mine:
        by_name.setdefault(s.name, []).append(s)
    servers = by_name["POST /api/predict"]
    assert len(servers) == 2
    assert all(s.parent is not None and s.parent.span_id == int(PARENT_ID, 16) for s in servers)
    assert all(s.attributes and s.attributes["spacepool.key"] == "traced-team" for s in servers)
    for name in ("spacepool.predict", "spacepool.admission", "spacepool.checkout",
                 "spacepool.space_call", "spacepool.upload", "spacepool.space_queue",
                 "spacepool.run", "spacepool.download"):  # fmt: skip
        assert name in by_name, (name, sorted(by_name))
        for s in by_name[name]:
            attrs = dict(s.attributes or {})
            assert attrs.get("spacepool.key") == "traced-team", (name, attrs)
            assert attrs.get("spacepool.outcome") == "ok", (name, attrs)
            if name != "spacepool.predict":
                assert attrs.get("spacepool.space") == "traced", (name, attrs)
    assert {s.attributes["spacepool.api_name"] for s in by_name["spacepool.predict"]
            if s.attributes} == {"/copy", "/headers"}  # fmt: skip
    ids = {s.context.span_id: s for s in mine}

    def under_server(s: ReadableSpan) -> bool:
        while s.parent is not None and s.parent.span_id in ids:
            s = ids[s.parent.span_id]
        return s.name == "POST /api/predict"

    assert all(under_server(s) for s in mine)
    # The Space got this trace's context, a span of the call as its parent.
    sent = said.json()["result"]["traceparent"]
    assert sent.split("-")[1] == TRACE_ID
    calls = {s.context.span_id for s in by_name["spacepool.space_call"]}
    assert int(sent.split("-")[2], 16) in calls
    text = _attrs(spans)
    for secret in (EMAIL, key, PAYLOAD, data, ADMIN_TOKEN):
        assert secret not in text


async def test_a_failover_is_an_event_of_the_library_predicts_trace(
    service: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    """Library predicts over a dead Space and a live one: the one that met the dead
    Space failed over, recorded as events of its spacepool.predict span, outcome ok."""
    from pool import get_pool

    pool = get_pool()
    for i in range(6):
        done = await pool.predict("/echo", f"t{i}", 0, safe_to_retry=True)
        assert done.space == "traced"
    predicts = [s for s in exporter.get_finished_spans() if s.name == "spacepool.predict"]
    assert len(predicts) == 6 and all(s.parent is None for s in predicts)
    events = [e for s in predicts for e in s.events]
    assert {e.name for e in events} >= {"spacepool.failover"}, events
    assert all(dict(s.attributes or {})["spacepool.outcome"] == "ok" for s in predicts)
