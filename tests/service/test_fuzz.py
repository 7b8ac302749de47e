"""Fuzzing the API in process: schemathesis cases from the app's own OpenAPI schema, and
arbitrary JSON and bytes, against the ASGI app with a real pool over real stand-in
Spaces. Nothing a caller can send may produce a 500, hang, or leak a slot.

The app and its pool run in one event loop in a thread (anyio's blocking portal), as
uvicorn would run them; hypothesis drives requests into it from the test thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import pkgutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import CheckContext, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.generation.meta import FuzzingPhaseData
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from app.core import ServiceSettings, services_of
from app.jobs import JobRunner
from app.main import create_app
from devspaces import SpaceFleet
from pool import Pool, PoolSettings, set_pool

from .conftest import coordinator_url


def _import_all(package: Any) -> None:
    """Import every module of ``package`` now, while collecting (one thread). pytest
    rewrites the modules of a plugin's distribution as they are first imported (an AST
    parse and compile each), and CPython 3.11.7 compiling in two threads at once fails
    with "AST constructor recursion depth mismatch" (cpython gh-106905): seen when a test
    made schemathesis import a module lazily while another thread of the worker compiled."""
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        with contextlib.suppress(Exception):  # optional extras (allure) are not installed
            importlib.import_module(info.name)


_import_all(schemathesis)

# schemathesis' own strategies use the random module, which hypothesis deprecates;
# that is theirs to fix, not a failure of the service.
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")

REQUEST_LIMIT_S = 20.0
MAX_TIMEOUT_S = 5.0
MAPPED_5XX = {"upstream", "busy", "no_healthy_space", "deadline", "shutting_down"}
FUZZ = settings(
    max_examples=250,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@dataclass
class Target:
    portal: BlockingPortal
    client: httpx.AsyncClient
    app: FastAPI
    pool: Pool
    cases: Any  # the schemathesis strategy over the app's OpenAPI, positive | negative

    def send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        async def call() -> httpx.Response:
            try:
                async with asyncio.timeout(REQUEST_LIMIT_S):
                    return await self.client.request(method, url, **kwargs)
            except TimeoutError:
                pytest.fail(f"{method} {url} hung for {REQUEST_LIMIT_S} s ({kwargs!r:.300})")

        return self.portal.call(call)


@pytest.fixture(scope="module")
def target(fleet: SpaceFleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """The ASGI app, no tokens, short deadlines, over a real pool on the stand-in fleet."""
    for space in fleet:
        space.control(mode="ok", config_delay_s=0.0)
    directory = tmp_path_factory.mktemp("fuzz")
    pool = Pool(
        PoolSettings(
            spaces=fleet.pool_spaces_env(),
            coordinator_url=coordinator_url(directory),
            queue_timeout_s=2.0,
            min_connections=1,
            global_max_concurrent=32,
            consumer_max_concurrent=4,
        )
    )
    service = ServiceSettings(
        admin_token=None,
        api_token=None,
        predict_timeout_s=MAX_TIMEOUT_S,
        job_timeout_s=MAX_TIMEOUT_S,
        job_queue_timeout_s=2.0,
    )
    set_pool(pool)
    app = create_app(service)
    # Built here, before the app's thread starts: schemathesis imports modules lazily,
    # and CPython 3.11.7 compiling source in two threads at once can fail with
    # "SystemError: AST constructor recursion depth mismatch" (cpython gh-106905; seen
    # when the test thread imported schemathesis while the app served requests).
    schema = schemathesis.openapi.from_dict(app.openapi())
    cases = schema.as_strategy(GenerationMode.POSITIVE) | schema.as_strategy(
        GenerationMode.NEGATIVE
    )
    try:
        with (
            start_blocking_portal() as portal,
            portal.wrap_async_context_manager(app.router.lifespan_context(app)),
        ):
            client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://svc", timeout=60
            )
            yield Target(portal, client, app, pool, cases)
            portal.call(client.aclose)
    finally:
        set_pool(None)


def check(response: httpx.Response, what: str) -> None:
    """No 500; a 5xx is one of the mapped answers; JSON parses; request id present."""
    assert response.status_code != 500, f"{what}: 500 {response.text[:500]}"
    assert "x-request-id" in response.headers
    if response.headers.get("content-type", "").startswith("application/json"):
        body = response.json()
        if response.status_code >= 500:
            assert body.get("error") in MAPPED_5XX, f"{what}: {response.text[:500]}"
        if response.status_code == 503:
            assert int(response.headers["Retry-After"]) >= 1


def clamp(body: Any) -> Any:
    """Keep generated deadlines short, so a valid 3600 s predict cannot stall the run."""
    if isinstance(body, dict):
        value = body.get("timeout_s")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 5:
            body["timeout_s"] = MAX_TIMEOUT_S
    return body


def settle(target: Target) -> None:
    """Wait (bounded) until every job ended and no slot or connection is held."""

    async def idle() -> bool:
        runner = services_of(target.app).get(JobRunner)
        counts = await runner.store.counts()
        stats = await target.pool.stats()
        return (
            counts.get("queued", 0) + counts.get("running", 0) == 0
            and stats["inUseConnections"] == 0
            and stats["admission"]["globalInUse"] == 0
            and stats["totalQueued"] == 0
        )

    deadline = time.monotonic() + 30
    while not target.portal.call(idle):
        assert time.monotonic() < deadline, "slots or jobs still held 30 s after fuzzing"
        time.sleep(0.05)


def _as_bytes(content: Any) -> Any:
    """A file part's content httpx can send: a negative case may make it a number or
    None, which httpx fails on while streaming the body (in the client, but inside the
    ASGI app's ``receive``, where it looked like the service's own 500)."""
    if isinstance(content, (bytes, str)) or hasattr(content, "read"):
        return content
    return json.dumps(content, default=str).encode()


def _encodable_files(files: Any) -> Any:
    """``files`` (a dict or a list of (field, part) pairs) with each part's content bytes."""

    def part(value: Any) -> Any:
        if isinstance(value, tuple) and len(value) >= 2:
            return (value[0], _as_bytes(value[1]), *value[2:])
        return _as_bytes(value)

    if isinstance(files, dict):
        return {name: part(value) for name, value in files.items()}
    return [(name, part(value)) for name, value in files]


def as_request(case: Any) -> tuple[str, str, dict[str, Any]]:
    """The case as httpx arguments: JSON, raw bytes, or multipart parts (``files``)."""
    kwargs = case.as_transport_kwargs(base_url="http://svc")
    method, url = kwargs.pop("method"), kwargs.pop("url")
    request: dict[str, Any] = {
        "headers": {k: str(v) for k, v in (kwargs.get("headers") or {}).items()},
        "params": kwargs.get("params") or None,
    }
    if "json" in kwargs:
        request["json"] = kwargs["json"]
    elif kwargs.get("files"):
        request["files"] = _encodable_files(kwargs["files"])
        if isinstance(kwargs.get("data"), dict):
            request["data"] = kwargs["data"]
    elif kwargs.get("data") is not None:
        data = kwargs["data"]
        request["content"] = data if isinstance(data, bytes) else str(data).encode()
    return method, url, request


def test_schemathesis_cases_never_get_a_500_or_hang(target: Target) -> None:
    """Positive and negative cases for every operation of the OpenAPI schema: no 500, no hang."""
    cases = target.cases
    seen: dict[int, int] = {}

    @FUZZ
    @given(case=cases)
    def run(case: Any) -> None:
        if isinstance(case.body, dict):
            case.body = clamp(case.body)
        method, url, request = as_request(case)
        response = target.send(method, url, **request)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        check(response, f"{method} {url}")

    run()
    settle(target)
    print(f"\nschemathesis statuses: {dict(sorted(seen.items()))}")
    assert any(200 <= code < 300 for code in seen), seen


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
predict_like = st.fixed_dictionaries(
    {"api_name": st.sampled_from(["/echo", "echo", "/state", "/fail", "/nope"])},
    optional={
        "args": st.lists(json_values, max_size=4),
        "kwargs": st.dictionaries(st.text(max_size=8), json_values, max_size=3),
        "email": st.none() | st.text(max_size=30) | st.emails(),
        "space": st.none() | st.sampled_from(["alpha", "beta", "gamma"]) | st.text(max_size=8),
        "timeout_s": st.none() | st.floats(allow_nan=True) | st.integers(),
    },
)


@settings(FUZZ, max_examples=150)
@given(
    path=st.sampled_from(["/api/predict", "/api/jobs"]),
    body=json_values | predict_like | st.binary(max_size=64),
)
def _raw_case(target: Target, path: str, body: Any) -> None:
    # Encoded here: NaN and Infinity go out as the bare tokens Python's json reads back.
    content = body if isinstance(body, bytes) else json.dumps(clamp(body)).encode()
    response = target.send(
        "POST", path, content=content, headers={"Content-Type": "application/json"}
    )
    check(response, f"POST {path} {body!r:.200}")


def test_arbitrary_json_and_bytes_bodies_never_get_a_500_or_hang(target: Target) -> None:
    """Arbitrary JSON values, predict-shaped dicts and raw bytes: no 500, no hang, no leak."""
    _raw_case(target)
    settle(target)


def test_admin_endpoints_refuse_everything_without_an_admin_token(target: Target) -> None:
    """POOL_ADMIN_TOKEN unset: pool-stats is 403 admin_disabled, whatever is sent."""
    for headers in ({}, {"Authorization": "Bearer anything"}):
        response = target.send("GET", "/api/admin/pool-stats", headers=headers)
        assert response.status_code == 403
        assert response.json()["error"] == "admin_disabled"


# The 422s a schema-valid request may get: a name the schema cannot enumerate, as
# the fleet's Spaces and their endpoints are only known at run time (SPEC 5: a 422
# naming the ones it has, before any slot is taken); and an Idempotency-Key the
# generator sent before with another body (SPEC 5b: the key reused is a 422).
RUNTIME_NAME_ERRORS = {"unknown_api_name", "unknown_space", "idempotency_key_reused"}


def positive_data_acceptance_but_unknown_names(
    ctx: CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """schemathesis' positive_data_acceptance, all of it, except that a schema-valid
    request naming a Space or endpoint the fleet lacks, or reusing an Idempotency-Key
    with another body, may be that documented 422."""
    if response.status_code == 422:
        with contextlib.suppress(ValueError, AttributeError):
            if response.json().get("error") in RUNTIME_NAME_ERRORS:
                return None
    result: bool | None = positive_data_acceptance(ctx, response, case)
    return result


def not_a_server_error_but_mapped(
    ctx: CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """schemathesis' not_a_server_error, except the service's mapped 5xx answers (SPEC 5:
    upstream 502, busy 503, deadline 504 — e.g. a schema-valid ``timeout_s`` of 5e-324),
    each documented in the operation's responses (status_code_conformance checks that)."""
    if response.status_code in (502, 503, 504):
        with contextlib.suppress(ValueError, AttributeError):
            if response.json().get("error") in MAPPED_5XX:
                return None
    result: bool | None = not_a_server_error(ctx, response, case)
    return result


def negative_data_rejection_but_mutated(
    ctx: CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """schemathesis' negative_data_rejection, for the cases it actually made invalid. Its
    negative generation sometimes gives up on a multipart body (a ``body`` part and binary
    extra parts), marks the case negative anyway and records no mutation ("Positive test
    case"): such a request is valid, and the service rightly accepts it (seen in CI as a
    202 for a well-formed job, one run in five)."""
    data = case.meta.phase.data if case.meta is not None else None
    if isinstance(data, FuzzingPhaseData) and (data.mutations, data.description) == (
        (),
        "Positive test case",
    ):
        return None
    result: bool | None = negative_data_rejection(ctx, response, case)
    return result


def test_schemathesis_all_checks_pass(target: Target) -> None:
    """Every schemathesis check (status codes, content types, headers, Allow, schemas,
    valid data accepted, no server error) holds for bounded positive and negative cases,
    JSON and multipart: the OpenAPI document is the truth. Three of schemathesis' checks
    are narrowed: to the documented answers a schema cannot rule out (run-time names,
    mapped 5xx), and to the cases schemathesis did make invalid."""
    cases = target.cases
    failures: list[str] = []

    @settings(FUZZ, max_examples=80)
    @given(case=cases)
    def run(case: Any) -> None:
        if isinstance(case.body, dict):
            case.body = clamp(case.body)
        method, url, request = as_request(case)
        response = target.send(method, url, **request)
        response.request.read()  # a multipart body is a stream; the checks read it
        try:
            case.validate_response(
                response,
                excluded_checks=[
                    positive_data_acceptance,
                    not_a_server_error,
                    negative_data_rejection,
                ],
                additional_checks=[
                    negative_data_rejection_but_mutated,
                    positive_data_acceptance_but_unknown_names,
                    not_a_server_error_but_mapped,
                ],
            )
        except BaseException as exc:  # collected, so that one run reports every kind
            failures.append(f"{method} {url} → {response.status_code}: {exc!s:.600}")

    run()
    settle(target)
    assert not failures, "\n".join(failures[:10])


def test_a_405_names_every_method_of_the_path(target: Target) -> None:
    """OPTIONS /api/jobs/{id} is 405 with an Allow header naming GET and DELETE both."""
    response = target.send("OPTIONS", "/api/jobs/some-job")
    assert response.status_code == 405
    assert {m.strip() for m in response.headers["Allow"].split(",")} >= {"GET", "DELETE"}
    assert target.send("PUT", "/api/jobs").headers["Allow"] == "POST"
