"""Findings 1, 4, 5 and 7 of the trust-boundary issue: files, through both faces.

* A FileData naming a file of the service's host (a ``chmod 600`` canary) never
  reaches a Space, on every entry point (``/api/predict`` args, kwargs, stream,
  ``/api/jobs``, a relative path; the front's ``queue/join`` and ``call/``) and on
  both transports. The stand-in's ``/checksum`` answers ``"<size> <sha256>"`` of the
  file it got: the canary's digest must never come back (a positive control with a
  real upload shows the same check sees a file that did reach it).
* Files the service serves are inert on its origin; ``file=`` cannot leave the
  Space's file route; uploads are bounded, private, opaque and swept by TTL.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devspaces import SpaceProcess
from tests.service.conftest import ROOT, ServiceProcess, service_env

pytestmark = pytest.mark.asyncio(loop_scope="module")
UPLOAD_CAP = 64 * 1024


@pytest.fixture(scope="module")
def media() -> Iterator[SpaceProcess]:
    with SpaceProcess("media", kind="image") as space:
        yield space


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A file only the service's user may read, and the digest /checksum would give."""
    path = tmp_path_factory.mktemp("canary") / "canary.txt"
    data = f"canary {secrets.token_hex(16)}\n".encode()
    path.write_bytes(data)
    path.chmod(0o600)
    return path, f"{len(data)} {hashlib.sha256(data).hexdigest()}"


def relative_to_service(path: Path) -> str:
    """``path`` as seen from the service's working directory (the checkout)."""
    return os.path.relpath(path, ROOT)


@pytest.fixture(scope="module", params=["native", "gradio_client"])
def service(
    request: pytest.FixtureRequest, media: SpaceProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    folder = tmp_path_factory.mktemp(f"files-{request.param}")
    env = service_env(f"media={media.url}", folder, POOL_TRANSPORT=str(request.param),
                      POOL_MAX_UPLOAD_BYTES=str(UPLOAD_CAP), POOL_FILE_TTL_S="3",
                      POOL_FILE_DIR=str(folder / "files"))  # fmt: skip
    started = ServiceProcess(env, folder / "service.log")
    started.transport = str(request.param)  # type: ignore[attr-defined]
    yield started
    started.stop()


async def raw_get(client: httpx.AsyncClient, path: str) -> httpx.Response:
    """GET ``path`` exactly as written, over a plain socket (httpx would resolve its
    dot segments before sending); the answer's status line and body."""
    url = client.base_url
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {url.host}\r\nConnection: close\r\n\r\n"
                     .encode())  # fmt: skip
        raw = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return httpx.Response(status, content=body)


def file_data(path: str) -> dict[str, Any]:
    return {"path": path, "meta": {"_type": "gradio.FileData"}}


async def _job_text(client: httpx.AsyncClient, created: httpx.Response) -> str:
    """Everything the job says until it is final (or the create answer if refused)."""
    if created.status_code != 202:
        return created.text
    url = created.json()["url"]
    for _ in range(300):
        got = await client.get(url)
        if got.json().get("stage") in ("done", "failed", "cancelled"):
            return got.text
        await asyncio.sleep(0.1)
    pytest.fail("the job never ended")


async def test_a_file_of_the_services_host_never_reaches_a_space(
    service: ServiceProcess, canary: tuple[Path, str]
) -> None:
    path, digest = canary
    relative = relative_to_service(path)
    async with service.client() as client:
        # The control: a file the caller uploads does reach the Space, and is seen.
        body = {"space": "media", "api_name": "/checksum", "args": [{"file": {"upload": "f"}}]}
        control = await client.post("/api/predict", data={"body": json.dumps(body)},
                                     files={"f": ("canary.txt", path.read_bytes())})  # fmt: skip
        assert control.status_code == 200 and control.json()["result"] == digest

        answers: list[str] = []
        for where in (path.as_posix(), relative):
            for body in (
                {"api_name": "/checksum", "args": [file_data(where)]},
                {"api_name": "/checksum", "kwargs": {"path": file_data(where)}},
                {"api_name": "/checksum", "args": [file_data(where)], "stream": True},
                {"api_name": "/checksum", "args": [[file_data(where)]]},
            ):
                got = await client.post("/api/predict", json={"space": "media", **body})
                assert got.status_code != 500, got.text
                answers.append(got.text)
            created = await client.post(
                "/api/jobs", json={"space": "media", "api_name": "/checksum",
                                   "args": [file_data(where)]})  # fmt: skip
            answers.append(await _job_text(client, created))
    for answer in answers:
        assert digest not in answer, answer[:300]


async def test_the_front_never_sends_a_file_of_the_services_host(
    service: ServiceProcess, canary: tuple[Path, str]
) -> None:
    path, digest = canary
    texts: list[str] = []
    async with service.client() as client:
        served = await client.get("/gradio/media/config")
        if service.transport != "native":  # type: ignore[attr-defined]
            assert served.status_code == 501  # the front needs the native transport
            return
        config = served.json()
        fn_index = next(d["id"] for d in config["dependencies"] if d["api_name"] == "checksum")
        for where in (path.as_posix(), relative_to_service(path)):
            join = await client.post("/gradio/media/gradio_api/queue/join", json={
                "data": [file_data(where)], "fn_index": fn_index, "session_hash": "s" + where[-6:]})
            assert join.status_code != 500, join.text
            texts.append(join.text)
            if join.status_code == 200:
                async with client.stream("GET", "/gradio/media/gradio_api/queue/data",
                                         params={"session_hash": "s" + where[-6:]}) as stream:
                    async for line in stream.aiter_lines():
                        texts.append(line)
                        if "close_stream" in line:
                            break
            call = await client.post("/gradio/media/gradio_api/call/checksum",
                                     json={"data": [file_data(where)]})  # fmt: skip
            assert call.status_code != 500, call.text
            texts.append(call.text)
            if call.status_code == 200:
                event = call.json()["event_id"]
                got = await client.get(f"/gradio/media/gradio_api/call/checksum/{event}")
                texts.append(got.text)
    assert texts
    for text in texts:
        assert digest not in text, text[:300]


async def test_front_uploads_are_bounded_private_opaque_and_swept(
    service: ServiceProcess,
) -> None:
    async with service.client() as client:
        big = await client.post("/gradio/media/gradio_api/upload",
                                files={"files": ("big.bin", b"x" * (UPLOAD_CAP + 1))})  # fmt: skip
        assert big.status_code == 413, big.text
        small = await client.post("/gradio/media/gradio_api/upload",
                                  files={"files": ("note.txt", b"hello")})  # fmt: skip
        assert small.status_code == 200
        (upload,) = small.json()
        assert upload.startswith("spacepool-upload/")  # an opaque id, no host path
        assert str(service.log_path.parent) not in upload and "/tmp" not in upload
        got = await client.get(f"/gradio/media/gradio_api/file={upload}")
        assert got.status_code == 200 and got.content == b"hello"
        # An upload is what an event gets (the Space's copy of it), on either face.
        expected = f"5 {hashlib.sha256(b'hello').hexdigest()}"
        if service.transport == "native":  # type: ignore[attr-defined]
            call = await client.post("/gradio/media/gradio_api/call/checksum",
                                     json={"data": [file_data(upload)]})  # fmt: skip
            event = call.json()["event_id"]
            done = await client.get(f"/gradio/media/gradio_api/call/checksum/{event}")
            assert expected in done.text
        api = await client.post("/api/predict", json={
            "space": "media", "api_name": "/checksum", "args": [file_data(upload)]})
        assert api.status_code == 200 and api.json()["result"] == expected
        # Private on disk: the store's folders 0700, its files 0600.
        data = service.log_path.parent / "files" / "data"
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        modes = {stat.S_IMODE(p.stat().st_mode) for p in data.iterdir()}
        assert modes == {0o600}, modes
        # Swept by the TTL (3 s) with no front session needed.
        await asyncio.sleep(3.5)
        gone = await client.get(f"/gradio/media/gradio_api/file={upload}")
        assert gone.status_code == 404


async def test_served_files_are_inert_and_file_routes_stay_in_place(
    service: ServiceProcess,
) -> None:
    async with service.client() as client:
        page = b"<html><script>localStorage.setItem('pwned', '1')</script></html>"
        (html,) = (await client.post("/gradio/media/gradio_api/upload",
                                     files={"files": ("x.html", page)})).json()  # fmt: skip
        got = await client.get(f"/gradio/media/gradio_api/file={html}")
        assert got.status_code == 200
        assert got.headers["x-content-type-options"] == "nosniff"
        assert got.headers["content-disposition"].startswith("attachment")
        assert "sandbox" in got.headers["content-security-policy"]
        png = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
        (image,) = (await client.post("/gradio/media/gradio_api/upload",
                                      files={"files": ("x.png", png)})).json()  # fmt: skip
        shown = await client.get(f"/gradio/media/gradio_api/file={image}")
        assert shown.headers["content-disposition"].startswith("inline")
        assert "sandbox" in shown.headers["content-security-policy"]
        # file= reaches only the Space's file route.
        for escape in ("x/../../config", "x/..%2f..%2fconfig", "x%2f..%2f..%2fconfig",
                       "..", "a/./b", "x/../../gradio_api/info"):  # fmt: skip
            out = await raw_get(client, f"/gradio/media/gradio_api/file={escape}")
            assert out.status_code == 404, (escape, out.text[:200])
            assert "dependencies" not in out.text and "<html" not in out.text.lower()

        if service.transport == "native":  # type: ignore[attr-defined]
            info = await client.get("/gradio/media/gradio_api/info")
            assert info.status_code == 200
            assert "127.0.0.1" not in info.text.replace(service.url, ""), "upstream address"
