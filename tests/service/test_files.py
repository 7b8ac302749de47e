"""Files through the HTTP service, against a real image/file stand-in Space ("pic"):
uploads (multipart, base64, URL), output files served under /api/files/{token} (bytes
equal to what a plain gradio_client.Client gets), expiry, the disk bound, traversal
attempts, size caps, and no temp file left behind."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gradio_client import Client, handle_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from devspaces import SpaceFleet, SpaceProcess

from .conftest import ServiceFactory, ServiceProcess, eventually

API_TOKEN = "api-token-for-files-7d0e"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
UPLOAD_CAP = 64 * 1024
OUTPUT_CAP = 20_000
DISK_CAP = 5_000
LINE = "pic:x\n"  # one line of /report with text "x"


@pytest.fixture(scope="module")
def pic() -> Iterator[SpaceProcess]:
    """One image/file stand-in Space."""
    with SpaceProcess("pic", kind="image") as space:
        yield space


def _spaces(fleet: SpaceFleet, pic: SpaceProcess) -> str:
    return f"{fleet.pool_spaces_env()},pic={pic.url}"


@pytest.fixture(scope="module")
def files_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("files")


@pytest.fixture(scope="module")
def service(
    start_service: ServiceFactory, fleet: SpaceFleet, pic: SpaceProcess, files_dir: Path
) -> ServiceProcess:
    """Default file settings, its download folder where the test can look."""
    return start_service(POOL_SPACES=_spaces(fleet, pic), POOL_FILE_DIR=str(files_dir))


@pytest.fixture(scope="module")
def limits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("limited")


@pytest.fixture(scope="module")
def limited(
    start_service: ServiceFactory, fleet: SpaceFleet, pic: SpaceProcess, limits_dir: Path
) -> ServiceProcess:
    """Two workers sharing the folder; small caps, 5 s file URLs, URL arguments, a token."""
    return start_service(
        workers=2,
        POOL_SPACES=_spaces(fleet, pic),
        POOL_FILE_DIR=str(limits_dir),
        POOL_MAX_UPLOAD_BYTES=str(UPLOAD_CAP),
        POOL_FILE_MAX_BYTES=str(OUTPUT_CAP),
        POOL_FILE_MAX_TOTAL_BYTES=str(DISK_CAP),
        POOL_FILE_TTL_S="5",  # short, yet longer than a loaded machine's predict
        POOL_ALLOW_FILE_URLS="true",
        POOL_API_TOKEN=API_TOKEN,
    )


def png_bytes(width: int = 16, height: int = 8) -> bytes:
    image = Image.new("RGB", (width, height))
    for x in range(width):
        for y in range(height):
            image.putpixel((x, y), (x * 15, y * 30, (x * y) % 256))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def raw_flip(pic: SpaceProcess, image: bytes, tmp_path: Path) -> bytes:
    """What a plain gradio_client.Client downloads for the same /flip call."""
    source = tmp_path / "in.png"
    source.write_bytes(image)
    client = Client(pic.url, verbose=False, download_files=str(tmp_path / "raw"))
    try:
        path = client.predict(handle_file(str(source)), api_name="/flip")
    finally:
        client.close()
    return Path(path).read_bytes()


def raw_tone(pic: SpaceProcess, frequency: float, tmp_path: Path) -> tuple[bytes, str]:
    """What a plain gradio_client.Client downloads for /tone: (WAV bytes, caption)."""
    client = Client(pic.url, verbose=False, download_files=str(tmp_path / "raw"))
    try:
        path, caption = client.predict(frequency, api_name="/tone")
    finally:
        client.close()
    return Path(path).read_bytes(), str(caption)


def leftovers(directory: Path) -> list[str]:
    """Files still in the upload and partial-download folders."""
    return [
        str(p.relative_to(directory))
        for sub in ("incoming", "partial")
        for p in (directory / sub).rglob("*")
    ]


def published(directory: Path) -> list[str]:
    return sorted(p.name for p in (directory / "data").iterdir())


async def test_an_image_round_trips_multipart_in_url_out_with_the_raw_clients_bytes(
    service: ServiceProcess, pic: SpaceProcess, files_dir: Path, tmp_path: Path
) -> None:
    """Multipart upload → the Space flips it → the URL's bytes equal a raw Client's."""
    image = png_bytes()
    expected = raw_flip(pic, image, tmp_path)
    body = {"space": "pic", "api_name": "/flip", "args": [{"file": {"upload": "image"}}]}
    async with service.client() as client:
        response = await client.post(
            "/api/predict",
            data={"body": json.dumps(body)},
            files={"image": ("cat.png", image, "image/png")},
        )
        assert response.status_code == 200, response.text
        out = response.json()["result"]["file"]
        assert out["url"].startswith("/api/files/") and out["name"] == "image.png"
        assert out["mime_type"] == "image/png" and out["size"] == len(expected)
        assert "path" not in json.dumps(response.json())  # no path of the Space or ours
        got = await client.get(out["url"])
    assert got.status_code == 200
    assert got.content == expected
    assert got.headers["content-type"] == "image/png"
    assert got.headers["content-disposition"].startswith("attachment")
    assert got.headers["x-content-type-options"] == "nosniff"
    flipped = ImageOps.mirror(Image.open(io.BytesIO(image)).convert("RGB"))
    assert list(Image.open(io.BytesIO(got.content)).convert("RGB").getdata()) == list(
        flipped.getdata()
    )
    assert leftovers(files_dir) == []


async def test_base64_in_and_inline_out_carry_the_same_bytes(
    service: ServiceProcess, pic: SpaceProcess, files_dir: Path, tmp_path: Path
) -> None:
    """{"file": {"b64"}} in (args or kwargs), "files": "inline" out: the raw Client's bytes."""
    image = png_bytes(10, 10)
    expected = raw_flip(pic, image, tmp_path)
    before = published(files_dir)
    body = {
        "space": "pic",
        "api_name": "/flip",
        "args": [{"file": {"b64": base64.b64encode(image).decode(), "name": "a.png"}}],
        "files": "inline",
    }
    async with service.client() as client:
        response = await client.post("/api/predict", json=body)
    assert response.status_code == 200, response.text
    out = response.json()["result"]["file"]
    assert "url" not in out and out["size"] == len(expected)
    assert base64.b64decode(out["b64"]) == expected
    assert published(files_dir) == before  # inline: nothing kept on disk
    by_name = {"space": "pic", "api_name": "/checksum",
               "kwargs": {"path": {"file": {"b64": base64.b64encode(image).decode()}}}}  # fmt: skip
    async with service.client() as client:
        response = await client.post("/api/predict", json=by_name)
    assert response.status_code == 200, response.text
    assert response.json()["result"] == f"{len(image)} {hashlib.sha256(image).hexdigest()}"
    assert leftovers(files_dir) == []


async def test_a_job_uploads_a_file_and_returns_a_generated_file_by_url(
    service: ServiceProcess, files_dir: Path
) -> None:
    """POST /api/jobs multipart: the Space saw the uploaded bytes; a gr.File output comes by URL."""
    payload = os.urandom(3000)
    checksum = {"space": "pic", "api_name": "/checksum", "args": [{"file": {"upload": "f"}}]}
    async with service.client() as client:
        created = await client.post(
            "/api/jobs",
            data={"body": json.dumps(checksum)},
            files={"f": ("blob.bin", payload, "application/octet-stream")},
        )
        assert created.status_code == 202, created.text
        url = created.json()["url"]

        async def done() -> bool:
            return bool((await client.get(url)).json()["stage"] in ("done", "failed"))

        await eventually(done, 30, "checksum job finished")
        job = (await client.get(url)).json()
        assert job["stage"] == "done", job
        assert job["result"] == f"{len(payload)} {hashlib.sha256(payload).hexdigest()}"

        report = {"space": "pic", "api_name": "/report", "args": ["x", 50]}
        created = await client.post("/api/jobs", json=report)
        url = created.json()["url"]
        await eventually(done, 30, "report job finished")
        job = (await client.get(url)).json()
        assert job["stage"] == "done", job
        got = await client.get(job["result"]["file"]["url"])
    assert got.status_code == 200 and got.text == LINE * 50
    assert got.headers["content-type"].startswith("text/plain")
    assert leftovers(files_dir) == []


async def test_bad_file_arguments_are_clear_422s_and_leave_nothing_behind(
    service: ServiceProcess, files_dir: Path
) -> None:
    """Bad base64, an unknown part, a malformed file object, URLs when off: 422, no temp file."""
    cases: list[Any] = [
        {"file": {"b64": "not*base64!"}},
        {"file": {"upload": "nope"}},
        {"file": {"b64": "AAAA", "url": "http://127.0.0.1/"}},
        {"file": {"b64": 5}},
        {"file": {"url": "http://127.0.0.1:9/secret"}},  # POOL_ALLOW_FILE_URLS is off here
    ]
    async with service.client() as client:
        for arg in cases:
            body = {"space": "pic", "api_name": "/checksum", "args": [arg]}
            response = await client.post("/api/predict", json=body)
            assert response.status_code == 422, (arg, response.text)
            assert response.json()["error"] == "invalid_request", response.text
        good = base64.b64encode(b"ok").decode()
        body = {"api_name": "/checksum", "space": "pic",
                "args": [{"file": {"b64": good}}, {"file": {"upload": "missing"}}]}  # fmt: skip
        response = await client.post("/api/predict", json=body)
        assert response.status_code == 422
        for space in ("nope", "pic-unknown"):  # checked before any file is written
            body = {"space": space, "api_name": "/checksum", "args": [{"file": {"upload": "f"}}]}
            response = await client.post(
                "/api/predict", data={"body": json.dumps(body)}, files={"f": ("a", b"x")}
            )
            assert response.status_code == 422 and response.json()["error"] == "unknown_space"
        no_body = await client.post("/api/predict", files={"f": ("a", b"x")})
        assert no_body.status_code == 422 and no_body.json()["error"] == "invalid_body"
        bad_json = await client.post(
            "/api/predict", data={"body": "{nope"}, files={"f": ("a", b"x")}
        )
        assert bad_json.status_code == 422 and bad_json.json()["error"] == "invalid_body"
    assert leftovers(files_dir) == []


async def test_traversal_attempts_and_unknown_tokens_answer_404(
    service: ServiceProcess, files_dir: Path
) -> None:
    """Paths built to escape the download folder, and unknown tokens: 404/422, never a file."""
    (files_dir / "secret.txt").write_text("root:x:0:0")
    attempts = [
        "/api/files/..%2Fsecret.txt",
        "/api/files/..%2F..%2F..%2Fetc%2Fpasswd",
        "/api/files/%2e%2e%2fsecret.txt",
        "/api/files/" + "." * 43,
        "/api/files/" + urllib.parse.quote("../" * 14 + "etc/pw", safe=""),
        "/api/files/" + "A" * 43,  # the shape of a token, never issued
        "/api/files/secret.txt",
        "/api/files/data",
    ]
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        for path in attempts:
            response = await client.get(httpx.URL(service.url + path))
            assert response.status_code in (404, 422), (path, response.status_code)
            assert "root:" not in response.text


async def test_expired_urls_answer_404_and_their_files_are_deleted(
    limited: ServiceProcess, limits_dir: Path
) -> None:
    """POOL_FILE_TTL_S=5: a URL works, then answers 404 and its file is gone from disk."""
    body = {"space": "pic", "api_name": "/report", "args": ["x", 10]}
    async with limited.client(**AUTH) as client:
        response = await client.post("/api/predict", json=body)
        assert response.status_code == 200, response.text
        url = response.json()["result"]["file"]["url"]
        assert (await client.get(url)).status_code == 200
        assert len(published(limits_dir)) >= 2  # the bytes and their metadata

        async def expired() -> bool:
            return (await client.get(url)).status_code == 404

        await eventually(expired, 15, "the file URL expired", every_s=0.2)
        gone = await client.get(url)
    assert gone.json()["error"] == "file_not_found"

    def token_files() -> bool:
        key = hashlib.sha256(url.rsplit("/", 1)[1].encode()).hexdigest()
        return not any(name.startswith(key) for name in published(limits_dir))

    assert token_files()


async def test_the_disk_bound_evicts_the_oldest_files_first(
    limited: ServiceProcess, limits_dir: Path
) -> None:
    """POOL_FILE_MAX_TOTAL_BYTES: a new file pushes the oldest out (404), the newest stays."""
    urls = []
    lines = DISK_CAP // len(LINE) // 2 + 10  # two of them exceed the bound
    async with limited.client(**AUTH) as client:
        for text in ("a", "b"):
            body = {"space": "pic", "api_name": "/report", "args": [text, lines]}
            response = await client.post("/api/predict", json=body)
            assert response.status_code == 200, response.text
            urls.append(response.json()["result"]["file"]["url"])

        async def evicted() -> bool:  # the sweep runs in a thread right after the publish
            return (await client.get(urls[0])).status_code == 404

        await eventually(evicted, 10, "the oldest file evicted")
        second = await client.get(urls[1])
    assert second.status_code == 200 and len(second.content) == lines * len("pic:b\n")
    data = limits_dir / "data"
    assert sum(p.stat().st_size for p in data.iterdir() if p.suffix != ".json") <= DISK_CAP


async def test_uploads_over_the_cap_answer_413_and_leave_nothing_behind(
    limited: ServiceProcess, limits_dir: Path
) -> None:
    """POOL_MAX_UPLOAD_BYTES: a multipart file or base64 over it is 413 too_large."""
    big = os.urandom(UPLOAD_CAP + 1)
    body = {"space": "pic", "api_name": "/checksum", "args": [{"file": {"upload": "f"}}]}
    async with limited.client(**AUTH) as client:
        for path in ("/api/predict", "/api/jobs"):
            response = await client.post(
                path, data={"body": json.dumps(body)}, files={"f": ("big.bin", big)}
            )
            assert response.status_code == 413, response.text
            assert response.json()["error"] == "too_large"
        huge = await client.post(
            "/api/predict", data={"body": json.dumps(body)}, files={"f": ("h", big * 20)}
        )
        assert huge.status_code == 413
        as_b64 = base64.b64encode(big[: UPLOAD_CAP // 2 + UPLOAD_CAP // 2 + 1]).decode()
        b64_body = {"space": "pic", "api_name": "/checksum", "args": [{"file": {"b64": as_b64}}]}
        response = await client.post("/api/predict", json=b64_body)
        assert response.status_code == 413, response.text
        fits = os.urandom(UPLOAD_CAP - 10)
        response = await client.post(
            "/api/predict", data={"body": json.dumps(body)}, files={"f": ("ok.bin", fits)}
        )
        assert response.status_code == 200, response.text
        assert response.json()["result"] == f"{len(fits)} {hashlib.sha256(fits).hexdigest()}"
    assert leftovers(limits_dir) == []


async def test_an_output_over_the_file_cap_is_502_and_leaves_no_partial_file(
    limited: ServiceProcess, limits_dir: Path
) -> None:
    """POOL_FILE_MAX_BYTES: an output file larger than it is 502 upstream file_too_large."""
    body = {"space": "pic", "api_name": "/report", "args": ["x", OUTPUT_CAP // len(LINE) + 100]}
    async with limited.client(**AUTH) as client:
        response = await client.post("/api/predict", json=body)
    assert response.status_code == 502, response.text
    assert response.json()["kind"] == "file_too_large"
    assert leftovers(limits_dir) == []


async def test_a_url_argument_is_fetched_when_allowed(
    limited: ServiceProcess, pic: SpaceProcess, limits_dir: Path
) -> None:
    """POOL_ALLOW_FILE_URLS on: {"file": {"url"}} is fetched and reaches the Space intact."""
    client = Client(pic.url, verbose=False, download_files=False)
    try:
        made = client.predict("u", 7, api_name="/report")
    finally:
        client.close()
    body = {"space": "pic", "api_name": "/checksum", "args": [{"file": {"url": made["url"]}}]}
    expected = ("pic:u\n" * 7).encode()
    async with limited.client(**AUTH) as http:
        response = await http.post("/api/predict", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["result"] == f"{len(expected)} {hashlib.sha256(expected).hexdigest()}"
    assert leftovers(limits_dir) == []


async def test_file_urls_need_the_api_token_when_one_is_set(limited: ServiceProcess) -> None:
    """Same auth as the request: without the bearer token a file URL is 401."""
    body = {"space": "pic", "api_name": "/report", "args": ["t", 2]}
    async with limited.client(**AUTH) as client:
        url = (await client.post("/api/predict", json=body)).json()["result"]["file"]["url"]
    async with limited.client() as anonymous:
        assert (await anonymous.get(url)).status_code == 401
        assert (await anonymous.get("/api/spaces")).status_code == 401
        assert (await anonymous.get("/api/spaces/pic/api")).status_code == 401


async def test_a_file_url_is_served_by_every_process_sharing_the_folder(
    limited: ServiceProcess,
    start_service: ServiceFactory,
    fleet: SpaceFleet,
    pic: SpaceProcess,
    limits_dir: Path,
) -> None:
    """Workers of one host share POOL_FILE_DIR: a URL one process issued, another serves.

    A second service over the same folder stands in for "the other worker": the kernel
    decides which uvicorn worker accepts a connection, so a test that waits for it to
    pick both is a test of the kernel's luck (it once gave one worker 80 in a row)."""
    peer = start_service(
        POOL_SPACES=_spaces(fleet, pic),
        POOL_FILE_DIR=str(limits_dir),
        POOL_FILE_TTL_S="5",
        POOL_API_TOKEN=API_TOKEN,
    )
    body = {"space": "pic", "api_name": "/report", "args": ["w", 40]}
    async with limited.client(**AUTH) as client:
        response = await client.post("/api/predict", json=body)
    assert response.status_code == 200, response.text
    path = response.json()["result"]["file"]["url"].removeprefix(limited.url)
    assert path.startswith("/api/files/"), path
    async with peer.client(**AUTH) as other:
        got = await other.get(path)
        unknown = await other.get(path[:-4] + "AAAA")
    assert got.status_code == 200, got.text
    assert got.text == "pic:w\n" * 40
    assert unknown.status_code == 404, unknown.text


async def test_malformed_multipart_and_file_objects_are_4xx_never_500(
    service: ServiceProcess, files_dir: Path
) -> None:
    """Broken multipart bodies, too many parts, odd file objects: a 4xx, no temp file left."""
    call = {"space": "pic", "api_name": "/checksum", "args": [{"file": {"upload": "f"}}]}
    body = json.dumps(call)
    odd: list[Any] = [
        {"file": {}},
        {"file": {"upload": "f"}},
        {"file": {"b64": ""}},
        {"file": {"b64": "AA==", "name": 5}},
        {"file": {"url": "ftp://x/y"}},
        {"file": {"b64": "AA==", "extra": 1}},
        {"file": {"name": "only"}},
    ]
    async with service.client() as client:
        for arg in odd:
            response = await client.post(
                "/api/predict", json={"space": "pic", "api_name": "/checksum", "args": [arg]}
            )
            assert response.status_code == 422, (arg, response.text)
        raw_cases = [
            (b'--x\r\nContent-Disposition: form-data; name="body"\r\n\r\n{}', "boundary=x"),
            (b"garbage", "boundary=x"),
            (b"", "boundary="),
            (b"--x--\r\n", "boundary=x"),
        ]
        for content, params in raw_cases:
            response = await client.post(
                "/api/predict",
                content=content,
                headers={"Content-Type": f"multipart/form-data; {params}"},
            )
            assert 400 <= response.status_code < 500, (content, response.text)
        many = {f"p{i}": (f"{i}.bin", b"x") for i in range(20)}
        response = await client.post("/api/predict", data={"body": body}, files=many)
        assert 400 <= response.status_code < 500, response.text
    assert leftovers(files_dir) == []


async def test_audio_inside_a_multi_output_result_comes_by_url(
    service: ServiceProcess, pic: SpaceProcess, tmp_path: Path
) -> None:
    """/tone returns (WAV, text): the file inside the list becomes a URL with the raw bytes."""
    expected, raw_caption = raw_tone(pic, 220, tmp_path)
    async with service.client() as http:
        response = await http.post(
            "/api/predict", json={"space": "pic", "api_name": "/tone", "args": [220]}
        )
        assert response.status_code == 200, response.text
        audio, caption = response.json()["result"]
        assert caption == raw_caption == "220 Hz"
        assert audio["file"]["name"] == "audio.wav"
        got = await http.get(audio["file"]["url"])
    assert got.content == expected and got.content[:4] == b"RIFF"
    assert got.headers["content-type"] in ("audio/wav", "audio/x-wav")


file_specs = st.dictionaries(
    st.sampled_from(["upload", "b64", "url", "name", "other"]),
    st.none() | st.integers() | st.text(max_size=12) | st.sampled_from(["AAAA", "aGk=", "f"]),
    max_size=3,
)


def test_random_file_objects_never_get_a_500_or_leave_files(
    service: ServiceProcess, files_dir: Path
) -> None:
    """Arbitrary {"file": {...}} objects in args and kwargs, JSON or multipart: no 500."""
    seen: dict[int, int] = {}
    with httpx.Client(base_url=service.url, timeout=30) as client:

        @settings(max_examples=60, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(spec=file_specs, where=st.sampled_from(["args", "kwargs"]), multipart=st.booleans())
        def run(spec: dict[str, Any], where: str, multipart: bool) -> None:
            arg = {"file": spec}
            body: dict[str, Any] = {"space": "pic", "api_name": "/checksum", "timeout_s": 10}
            body.update({"args": [arg]} if where == "args" else {"kwargs": {"path": arg}})
            if multipart:
                response = client.post(
                    "/api/predict", data={"body": json.dumps(body)}, files={"f": ("f.bin", b"xy")}
                )
            else:
                response = client.post("/api/predict", json=body)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, response.text
            assert response.status_code in (200, 400, 413, 422), response.text

        run()
    assert leftovers(files_dir) == []
    assert 422 in seen, seen


async def test_a_cancelled_jobs_uploads_are_deleted(
    service: ServiceProcess, files_dir: Path
) -> None:
    """DELETE a job that carries an upload: once it is final, its temp files are gone."""
    body = {"space": "pic", "api_name": "/checksum", "args": [{"file": {"upload": "f"}}]}
    async with service.client() as client:
        created = await client.post(
            "/api/jobs", data={"body": json.dumps(body)}, files={"f": ("a.bin", os.urandom(5000))}
        )
        assert created.status_code == 202, created.text
        cancelled = await client.delete(created.json()["url"])
    assert cancelled.json()["stage"] in ("cancelled", "done")

    async def clean() -> bool:
        return leftovers(files_dir) == []

    await eventually(clean, 10, "the cancelled job's uploads deleted")


async def test_a_file_url_answers_byte_ranges(service: ServiceProcess) -> None:
    """Range: one range is 206 with Content-Range, a suffix too; past the end 416; several: 200."""
    body = {"space": "pic", "api_name": "/report", "args": ["r", 50]}
    async with service.client() as client:
        url = (await client.post("/api/predict", json=body)).json()["result"]["file"]["url"]
        whole = (await client.get(url)).content
        assert whole == b"pic:r\n" * 50
        part = await client.get(url, headers={"Range": "bytes=6-13"})
        assert part.status_code == 206 and part.content == whole[6:14]
        assert part.headers["content-range"] == f"bytes 6-13/{len(whole)}"
        tail = await client.get(url, headers={"Range": "bytes=-4"})
        assert tail.status_code == 206 and tail.content == whole[-4:]
        rest = await client.get(url, headers={"Range": "bytes=290-"})
        assert rest.status_code == 206 and rest.content == whole[290:]
        beyond = await client.get(url, headers={"Range": f"bytes={len(whole)}-"})
        assert beyond.status_code == 416
        assert beyond.headers["content-range"] == f"bytes */{len(whole)}"
        several = await client.get(url, headers={"Range": "bytes=0-1,4-5"})
        assert several.status_code == 200 and several.content == whole
