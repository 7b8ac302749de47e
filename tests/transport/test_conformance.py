"""Transport conformance: the pool gives what a plain gradio_client.Client gives.

The same calls run through a plain ``gradio_client.Client`` (the reference) and through
the pool's public API (``Pool.predict``, ``PooledClient.submit`` / ``PooledJob.stream``),
against a stand-in Space of every ``devspaces`` kind, the "shapes" kind included (several
inputs and outputs, file/image/audio/gallery outputs, a generator whose partials travel
as diffs, ``gr.State``, ``gr.Progress``, ``gr.Info``/``gr.Warning``, ``gr.Error``, an
event with a ``concurrency_limit`` and a ``batch=True`` one). Results must be equal after
one normalisation: a file is compared by its bytes (the Client downloads it, the pool
fetches it with ``download_to=`` / ``PooledClient.download``), tuples compare as lists,
and a ``/stream`` partial's ``t`` (the Space's clock when it yielded) is dropped.

The pool side runs once per transport (``PoolSettings(transport=...)``, env
``POOL_TRANSPORT``): "gradio_client" (today's path) and "native" (the asyncio transport).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image

from devspaces import SpaceFleet
from pool import (
    LocalFile,
    Partial,
    Pool,
    UpstreamAppError,
    file_arg,
)
from tests.conftest import EVERY_KIND, PoolMaker

KINDS = EVERY_KIND
TRANSPORTS = ("gradio_client", "native")


@pytest.fixture
def spaces(every_kind: SpaceFleet) -> SpaceFleet:
    """One stand-in Space of each kind, named after its kind (the session's, shared)."""
    return every_kind


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """The pool's transport under test."""
    name: str = request.param
    return name


@pytest.fixture
def pool(spaces: SpaceFleet, make_pool: PoolMaker, transport: str) -> Pool:
    """A pool over every stand-in, on ``transport``; one connection per Space to start."""
    return make_pool(spaces, min_connections=1, transport=transport)


class Clients:
    """Plain gradio_client.Clients: one shared per kind, or a fresh one (a new session)."""

    def __init__(self, spaces: SpaceFleet, downloads: Path) -> None:
        self.spaces = spaces
        self.downloads = downloads
        self.shared: dict[str, Client] = {}
        self.made: list[Client] = []

    def __call__(self, kind: str, *, fresh: bool = False) -> Client:
        if not fresh and kind in self.shared:
            return self.shared[kind]
        client = Client(
            self.spaces[kind].url, verbose=False, download_files=str(self.downloads / kind)
        )
        self.made.append(client)
        if not fresh:
            self.shared[kind] = client
        return client

    def close(self, closing: ThreadPoolExecutor) -> None:
        """Close every Client made, on ``closing``'s threads: ``Client.close()`` waits a
        second for its heartbeat thread (blocked reading the heartbeat stream), a wait
        that orders nothing, so the next test need not sit through it."""
        for client in self.made:
            closing.submit(Client.close, client)


@pytest.fixture(scope="module")
def closing() -> Iterator[ThreadPoolExecutor]:
    """Where the tests' Clients close; every close has returned when the module ends."""
    with ThreadPoolExecutor(16, thread_name_prefix="close-client") as executor:
        yield executor


@pytest.fixture
def raw(spaces: SpaceFleet, tmp_path: Path, closing: ThreadPoolExecutor) -> Iterator[Clients]:
    """Plain gradio_client.Clients against the stand-ins (fresh for each test), closed
    at the end of the test (each close returns by the module's end)."""
    clients = Clients(spaces, tmp_path / "raw")
    yield clients
    clients.close(closing)


def digest(data: bytes) -> tuple[str, int, str]:
    return ("file", len(data), hashlib.sha256(data).hexdigest())


def canon(value: Any, downloads: Path) -> Any:
    """``value`` with files as (size, sha256) of their bytes, tuples as lists, and the
    ``t`` timestamp of a ``/stream`` partial dropped."""
    if isinstance(value, LocalFile):
        return digest(value.read_bytes())
    if isinstance(value, str) and value.startswith(str(downloads)) and Path(value).is_file():
        return digest(Path(value).read_bytes())
    if isinstance(value, tuple | list):
        return [canon(v, downloads) for v in value]
    if isinstance(value, dict):
        if {"index", "text", "t"} <= value.keys():
            value = {k: v for k, v in value.items() if k != "t"}
        return {k: canon(v, downloads) for k, v in value.items()}
    return value


def png(tmp_path: Path) -> Path:
    """A small deterministic PNG to upload."""
    image = Image.new("RGB", (5, 4))
    for x in range(5):
        image.putpixel((x, 2), (50 * x, 255 - 50 * x, 7))
    path = tmp_path / "in.png"
    image.save(path)
    return path


def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "in.txt"
    path.write_bytes(b"conformance\n" * 40)
    return path


# One call each: (kind, api_name, args). Files are given as Path and sent as
# handle_file (Client) or file_arg (pool).
Call = tuple[str, str, tuple[Any, ...]]


def plain_calls(tmp_path: Path) -> list[Call]:
    image, document = png(tmp_path), text_file(tmp_path)
    return [
        ("echo", "/echo", ("hello", 0)),
        ("image", "/flip", (image,)),
        ("image", "/report", ("r", 5)),
        ("image", "/checksum", (document,)),
        ("image", "/tone", (330,)),
        ("image", "/echo", ("img", 0)),
        ("stream", "/echo", ("plain", 0)),
        ("shapes", "/multi", ("abc", 2.5, True)),
        ("shapes", "/multi", ("", 0, False)),
        ("shapes", "/bundle", ("xyz", 12)),
        ("shapes", "/gallery", (3,)),
        ("shapes", "/progress", (4,)),
        ("shapes", "/notify", ("hi",)),
        ("shapes", "/limited", ("lim", 0)),
        ("shapes", "/batch", ("b",)),
        ("shapes", "/echo", ("s", 0)),
        ("headers", "/copy", (document,)),
        ("headers", "/echo", ("h", 0)),
        ("upper", "/predict", ("up",)),
        ("state", "/predict", ("kept",)),
        ("filename", "/predict", ([document, image],)),
        ("zerogpu", "/gpu", ("z", 0.5)),  # 8 calls of 0.5 s within its 10 s quota
        ("zerogpu", "/echo", ("zg", 0)),
    ]


def generator_calls() -> list[Call]:
    return [
        ("stream", "/stream", ("w", 4, 0.01)),
        ("shapes", "/count", ("ab", 5)),
        ("chat", "/chat", ("hello",)),
    ]


ERROR_CALLS: list[Call] = [
    ("echo", "/fail", ("x",)),
    ("stream", "/fail", ("y",)),
    ("chat", "/fail", ("z",)),
    ("shapes", "/error", ("boom",)),
]


def _files(value: Any, wrap: Any) -> Any:
    """``value`` with each Path (also in a list: a multi-file input) as ``wrap(path)``."""
    if isinstance(value, Path):
        return wrap(value)
    return [_files(v, wrap) for v in value] if isinstance(value, list) else value


def for_client(args: tuple[Any, ...]) -> list[Any]:
    return [_files(a, lambda p: handle_file(str(p))) for a in args]


def for_pool(args: tuple[Any, ...]) -> list[Any]:
    return [_files(a, file_arg) for a in args]


async def reference(client: Client, api_name: str, args: tuple[Any, ...]) -> Any:
    return await asyncio.to_thread(client.predict, *for_client(args), api_name=api_name)


async def reference_outputs(client: Client, api_name: str, args: tuple[Any, ...]) -> list[Any]:
    """Every output a generator job sent, as the Client records them, and its result."""

    def run() -> list[Any]:
        job = client.submit(*for_client(args), api_name=api_name)
        result = job.result()
        outputs = list(job.outputs())
        assert outputs and outputs[-1] == result
        return outputs

    return await asyncio.to_thread(run)


async def test_every_kind_has_its_stand_in(spaces: SpaceFleet) -> None:
    """The fleet under test has one Space of each devspaces kind, shapes included."""
    from devspaces._kinds import KINDS as REGISTERED

    uncovered = set(REGISTERED) - set(KINDS)
    assert not uncovered, f"devspaces kinds without conformance calls here: {uncovered}"
    assert {space.kind for space in spaces} == set(KINDS)


async def test_plain_results_equal_through_pool_predict(
    pool: Pool, raw: Clients, tmp_path: Path
) -> None:
    """Pool.predict(download_to=) returns what Client.predict returns, files by bytes."""
    for kind, api_name, args in plain_calls(tmp_path):
        expected = canon(await reference(raw(kind), api_name, args), tmp_path)
        done = await pool.predict(
            api_name, *for_pool(args), space=kind, download_to=tmp_path / "pool"
        )
        assert done.space == kind
        assert canon(done.result, tmp_path) == expected, (kind, api_name)


async def test_plain_results_equal_through_a_leased_client(
    pool: Pool, raw: Clients, tmp_path: Path
) -> None:
    """PooledClient.submit + download gives the Client's results; stream() yields it once."""
    for kind, api_name, args in plain_calls(tmp_path):
        expected = canon(await reference(raw(kind), api_name, args), tmp_path)
        async with pool.client(space=kind) as client:
            job = await client.submit(*for_pool(args), api_name=api_name)
            streamed = [out async for out in job.stream()]
            result = await job.result()
            local = await client.download(result, tmp_path / "leased")
        assert canon(local, tmp_path) == expected, (kind, api_name)
        assert streamed == [result], (kind, api_name)


async def test_generator_partials_equal(pool: Pool, raw: Clients, tmp_path: Path) -> None:
    """Generator partials (diffs on the wire) equal the Client's, via stream() and on_partial."""
    seen: list[Any] = []

    async def on_partial(partial: Partial) -> None:
        seen.append(partial.output)

    for kind, api_name, args in generator_calls():
        expected = canon(await reference_outputs(raw(kind), api_name, args), tmp_path)
        async with pool.client(space=kind) as client:
            job = await client.submit(*args, api_name=api_name)
            streamed = [out async for out in job.stream()]
            result = await job.result()
        assert canon(streamed, tmp_path) == expected, (kind, api_name)
        assert canon(result, tmp_path) == expected[-1]

        seen.clear()
        done = await pool.predict(api_name, *args, space=kind, on_partial=on_partial)
        assert canon(done.result, tmp_path) == expected[-1], (kind, api_name)
        assert canon(seen, tmp_path) == expected, (kind, api_name)


async def test_app_errors_carry_the_spaces_message(pool: Pool, raw: Clients) -> None:
    """gr.Error: the Client raises AppError, the pool UpstreamAppError, same message."""
    for kind, api_name, args in ERROR_CALLS:
        with pytest.raises(AppError) as by_client:
            await reference(raw(kind), api_name, args)
        with pytest.raises(UpstreamAppError) as by_pool:
            await pool.predict(api_name, *args, space=kind)
        assert str(by_client.value) in str(by_pool.value), (kind, api_name)
        async with pool.client(space=kind) as client:
            with pytest.raises(UpstreamAppError) as by_lease:
                await client.predict(*args, api_name=api_name)
        assert str(by_pool.value) == str(by_lease.value)


async def test_a_stream_that_fails_after_partials(pool: Pool, raw: Clients, tmp_path: Path) -> None:
    """/stream_fail: the same partials, then the same app error, on both paths."""
    args = ("f", 3, 0.01)

    def run() -> tuple[list[Any], str]:
        job = raw("stream").submit(*args, api_name="/stream_fail")
        with pytest.raises(AppError) as failed:
            job.result()
        return list(job.outputs()), str(failed.value)

    outputs, message = await asyncio.to_thread(run)
    async with pool.client(space="stream") as client:
        job = await client.submit(*args, api_name="/stream_fail")
        streamed: list[Any] = []
        with pytest.raises(UpstreamAppError) as failed:
            async for out in job.stream():
                streamed.append(out)
    assert canon(streamed, tmp_path) == canon(outputs, tmp_path)
    assert len(streamed) == 3
    assert message in str(failed.value)


async def test_state_behaves_the_same_on_one_session(pool: Pool, raw: Clients) -> None:
    """gr.State: calls in one lease match calls on one Client; a new lease starts fresh."""
    sequences: list[tuple[str, str, list[tuple[Any, ...]]]] = [
        ("echo", "/state", [("a",), ("b",), ("c",)]),
        ("shapes", "/counter", [(5,), (2,), (-1,)]),
        ("shapes", "/history", [("x",), ("y",)]),
    ]
    for kind, api_name, steps in sequences:
        client = raw(kind, fresh=True)
        expected = [await reference(client, api_name, args) for args in steps]
        fresh = await reference(raw(kind, fresh=True), api_name, steps[0])
        async with pool.client(space=kind) as leased:
            got = [await leased.predict(*args, api_name=api_name) for args in steps]
        assert got == expected, (kind, api_name)
        async with pool.client(space=kind) as leased:
            assert await leased.predict(*steps[0], api_name=api_name) == fresh
    # The chat kind keeps its history in the session: the second reply names the first.
    client = raw("chat", fresh=True)
    expected = [await reference(client, "/chat", (m,)) for m in ("one", "two")]
    async with pool.client(space="chat") as leased:
        got = [await leased.predict(m, api_name="/chat") for m in ("one", "two")]
    assert got == expected and "one" in got[1]


async def test_concurrency_limit_and_batch(pool: Pool, raw: Clients) -> None:
    """concurrency_limit=2 and batch=True events: each caller gets the Client's result."""
    texts = [f"t{i}" for i in range(6)]
    client = raw("shapes")
    for api_name, args in (("/limited", lambda t: (t, 0.2)), ("/batch", lambda t: (t,))):
        expected = await asyncio.gather(*(reference(client, api_name, args(t)) for t in texts))
        done = await asyncio.gather(
            *(pool.predict(api_name, *args(t), space="shapes") for t in texts)
        )
        assert [d.result for d in done] == list(expected), api_name
    peak = await pool.predict("/limited", "?peak", 0, space="shapes")
    limit, largest_batch = (int(part.split("=")[1]) for part in peak.result.split())
    assert limit <= 2
    assert 1 <= largest_batch <= 4


async def test_protocol_events_reach_the_caller(pool: Pool, transport: str) -> None:
    """PooledJob.events(): queue, progress and log messages, stream()'s partials, then done."""

    async def events(api_name: str, *args: Any) -> list[Any]:
        async with pool.client(space="shapes") as client:
            job = await client.submit(*args, api_name=api_name)
            got = [event async for event in job.events()]
            with contextlib.suppress(UpstreamAppError):
                await job.result()
        return got

    def kind(event: Any) -> str:
        return type(event).__name__

    counted = await events("/count", "ab", 4)
    async with pool.client(space="shapes") as client:
        job = await client.submit("ab", 4, api_name="/count")
        streamed = [out async for out in job.stream()]
    assert [e.output for e in counted if kind(e) == "UpstreamPartial"] == streamed
    assert kind(counted[-1]) == "UpstreamDone" and counted[-1].success
    failed = await events("/error", "boom")
    assert kind(failed[-1]) == "UpstreamDone" and not failed[-1].success
    if transport != "native":
        return  # the fallback transport reports partials and done only

    notified = await events("/notify", "hi")
    assert [kind(e) for e in notified[:2]] == ["UpstreamQueued", "UpstreamStarted"]
    assert notified[0].rank == 0  # every joined event gets an estimation, even at once
    logs = [(e.level, e.message, e.title) for e in notified if kind(e) == "UpstreamLog"]
    assert logs == [("info", "info: hi", "Info"), ("warning", "warning: hi", "Warning")]
    progressed = await events("/progress", 4)
    units = [e.units[0] for e in progressed if kind(e) == "UpstreamProgress"]
    # Gradio sends the latest progress at most every 10 ms: a loaded machine may merge
    # updates, so the check is order and shape, not a count.
    assert units, "no progress event"
    assert all(u.length == 4 and u.unit == "steps" and u.desc == "step" for u in units)
    indices = [u.index for u in units]
    assert indices == sorted(set(indices)) and set(indices) <= {0, 1, 2, 3}
