"""Files through the library against a real image/file stand-in Space: output files
fetched while the slot is held (``Pool.predict(download_to=)``, ``PooledClient.download``),
bounded in size, nothing left behind on failure; and ``Pool.endpoints`` (view_api),
cached per app_id and read again after a restart."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gradio_client import Client, handle_file
from PIL import Image

from devspaces import SpaceFleet
from pool import LocalFile, UnknownSpace, UpstreamFileError, file_arg
from tests.conftest import TRANSPORTS, PoolMaker


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs on both transports, through the same interface."""
    return str(request.param)

_SECRET = "hf_private_token_for_file_tests_51e0a7"


@pytest.fixture(scope="module")
def pics() -> Iterator[SpaceFleet]:
    """One image/file stand-in Space, "pic"."""
    with SpaceFleet(names=["pic"], kind="image") as fleet:
        yield fleet


def png(tmp_path: Path) -> Path:
    image = Image.new("RGB", (6, 3))
    for x in range(6):
        image.putpixel((x, 1), (40 * x, 0, 255 - 40 * x))
    path = tmp_path / "in.png"
    image.save(path)
    return path


async def test_predict_download_to_fetches_the_raw_clients_bytes(
    pics: SpaceFleet, make_pool: PoolMaker, tmp_path: Path
) -> None:
    """download_to=: the result is a LocalFile whose bytes equal a plain Client's download."""
    source = png(tmp_path)
    raw = Client(pics["pic"].url, verbose=False, download_files=str(tmp_path / "raw"))
    try:
        downloaded = raw.predict(handle_file(str(source)), api_name="/flip")
    finally:
        raw.close()
    with open(downloaded, "rb") as f:  # noqa: ASYNC230 - a test's small local file
        expected = f.read()
    pool = make_pool(pics, min_connections=1)
    done = await pool.predict("/flip", file_arg(source), download_to=tmp_path / "out")
    assert isinstance(done.result, LocalFile)
    assert done.result.read_bytes() == expected
    assert done.result.size == len(expected) and done.result.mime_type == "image/png"
    assert done.result.path.parent == tmp_path / "out" and done.result.name == "image.png"
    flipped = Image.open(io.BytesIO(expected))
    assert flipped.getpixel((0, 1)) == (200, 0, 55)


async def test_without_download_to_the_result_is_the_spaces_file_data(
    pics: SpaceFleet, make_pool: PoolMaker, tmp_path: Path
) -> None:
    """No download_to: gradio's FileData dict (a path on the Space), nothing written here."""
    pool = make_pool(pics, min_connections=1)
    done = await pool.predict("/report", "q", 3)
    assert done.result["meta"] == {"_type": "gradio.FileData"}
    assert done.result["url"].startswith(pics["pic"].url)
    async with pool.client() as client:
        result = await client.predict("q", 3, api_name="/report")
        local = await client.download(result, tmp_path)
    assert local.read_bytes() == b"pic:q\n" * 3


async def test_a_private_spaces_files_carry_the_token_which_is_never_shown(
    pics: SpaceFleet, make_pool: PoolMaker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A private Space wants the token on every request, its files too (gradio_client
    sends its headers on file GETs; no signed URL): with POOL_HF_TOKEN the upload and
    both output files go through, nothing is refused, and the token shows nowhere."""
    pic = pics["pic"]
    pic.control(require_token=_SECRET)
    caplog.set_level(logging.DEBUG)
    try:
        pic.reset()
        pool = make_pool(pics, min_connections=1, hf_token=_SECRET)
        done = await pool.predict("/flip", file_arg(png(tmp_path)), download_to=tmp_path / "a")
        async with pool.client() as client:
            result = await client.predict("q", 2, api_name="/report")
            local = await client.download(result, tmp_path / "b")
        assert local.read_bytes() == b"pic:q\n" * 2 and done.result.size > 0
        assert pic.stats().unauthorized == 0
        async with httpx.AsyncClient() as http:  # the same file without the token: 401
            assert (await http.get(result["url"])).status_code == 401
        seen = [repr(done), repr(result), str(local.path), json.dumps(await pool.stats())]
    finally:
        pic.control(require_token="")
    seen += [caplog.text, *os.listdir(tmp_path / "a"), *os.listdir(tmp_path / "b")]
    assert not [text for text in seen if _SECRET in text]


async def test_an_output_over_the_cap_raises_and_leaves_nothing(
    pics: SpaceFleet, make_pool: PoolMaker, tmp_path: Path
) -> None:
    """POOL_FILE_MAX_BYTES: UpstreamFileError(file_too_large); the folder stays empty."""
    pool = make_pool(pics, min_connections=1, file_max_bytes=1000)
    with pytest.raises(UpstreamFileError) as caught:
        await pool.predict("/report", "big", 500, download_to=tmp_path)
    assert caught.value.kind == "file_too_large"
    assert os.listdir(tmp_path) == []
    stats = await pool.stats()
    assert stats["inUseConnections"] == 0 and stats["admission"]["globalInUse"] == 0


def test_a_result_cannot_point_the_download_at_another_origin() -> None:
    """file_url: a FileData url off the Space's origin is ignored for its /file= path."""
    from pool.transport import file_url, safe_name

    root = "http://127.0.0.1:7000/gradio_api/"
    meta = {"_type": "gradio.FileData"}
    own = {"path": "/tmp/a b.png", "url": root + "file=/tmp/x.png", "meta": meta}
    assert file_url(root, own) == own["url"]
    for elsewhere in ("http://169.254.169.254/latest/meta-data", "http://127.0.0.1:7001/x",
                      "https://127.0.0.1:7000/x", "file:///etc/passwd"):  # fmt: skip
        data = {"path": "/tmp/a b.png", "url": elsewhere, "meta": meta}
        assert file_url(root, data) == "http://127.0.0.1:7000/gradio_api/file=/tmp/a%20b.png"
    assert safe_name("../../etc/passwd") == "passwd"
    assert safe_name("..") == "file" and safe_name("a\x00b<>.png") == "a_b_.png"


async def test_endpoints_are_view_api_cached_per_app_id_and_refreshed_after_a_restart(
    pics: SpaceFleet, make_pool: PoolMaker
) -> None:
    """Pool.endpoints: view_api's dict; cached; a restarted Space (new app_id) is read again.

    Restarts the module's Space: the other tests of this module that use it come first."""
    pool = make_pool(pics, min_connections=1, max_connections=2)
    first = await pool.endpoints("pic")
    assert first["app_id"] == pics["pic"].app_id
    assert set(first["named_endpoints"]) == {"/flip", "/report", "/checksum", "/tone", "/echo"}
    configs = pics["pic"].stats().config_requests
    assert await pool.endpoints("pic") is first  # cached: no new connection, no I/O
    assert pics["pic"].stats().config_requests == configs
    new_app_id = pics["pic"].restart()
    await pool.health_check()
    deadline = time.monotonic() + 15
    while pool.spaces["pic"].app_id != new_app_id:
        assert time.monotonic() < deadline, "the pool did not see the restart"
        await asyncio.sleep(0.1)  # poll interval
        await pool.health_check()
    again = await pool.endpoints("pic")
    assert again["app_id"] == new_app_id != first["app_id"]
    assert again["named_endpoints"] == first["named_endpoints"]
    with pytest.raises(UnknownSpace):
        await pool.endpoints("nope")
