"""A Space behind Gradio's own login (``auth=``): ``POOL_SPACE_AUTH`` parsed and kept
secret, the pool logging in on both transports (a file round trip through the library),
a wrong password a clear error that leaks nothing, a restarted Space logged into again."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from devspaces import LOGIN_USERS, SpaceProcess
from pool import LocalFile, Login, Pool, PoolSettings, UpstreamError, file_arg
from pool._spaces import parse_logins, parse_spaces, with_logins
from tests.conftest import TRANSPORTS

(POOL_USER, POOL_PASSWORD), _ = LOGIN_USERS
WRONG = "not-the-password-5d1f"


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def locked() -> Iterator[SpaceProcess]:
    """An image/file stand-in Space behind Gradio's login."""
    with SpaceProcess("locked", kind="image", login=True) as space:
        yield space


def _pool(space: SpaceProcess, transport: str, password: str | None) -> Pool:
    auth = f"locked={POOL_USER}:{password}" if password is not None else None
    settings = PoolSettings(spaces=f"locked={space.url}", space_auth=auth,  # type: ignore[arg-type]
                            coordinator_url="memory://", queue_timeout_s=10.0,
                            min_connections=1, transport=transport)  # fmt: skip
    return Pool(settings)


def png(tmp_path: Path) -> Path:
    image = Image.new("RGB", (4, 2))
    image.putpixel((0, 0), (255, 0, 0))
    path = tmp_path / "in.png"
    image.save(path)
    return path


def test_space_auth_is_parsed_percent_decoded_and_never_shown() -> None:
    """name=user:password entries, %-decoded; the password is in no repr; errors name
    the entry's position, not its text; a login of no configured Space is refused."""
    logins = parse_logins(" a=u%2C1:p%3Aw%2Cd , b=v:x:y ")
    assert logins == {"a": Login("u,1", "p:w,d"), "b": Login("v", "x:y")}
    assert "p:w,d" not in repr(logins) and "x:y" not in repr(logins)
    for bad in ("a=secret-no-colon", "=u:secret", "a=:secret", "a=u:s,a=u:secret"):
        with pytest.raises(ValueError) as caught:
            parse_logins(bad)
        assert "secret" not in str(caught.value)
    specs = with_logins(parse_spaces(["a=http://h:1/", "b=http://h:2/"]), logins)
    assert specs[0].login == Login("u,1", "p:w,d") and "p:w,d" not in repr(specs)
    with pytest.raises(ValueError, match="names no configured Space: c"):
        with_logins(specs, {"c": Login("u", "p")})
    settings = PoolSettings(spaces="a=http://h:1/", space_auth="a=u:hidden-pw")  # type: ignore[arg-type]
    assert "hidden-pw" not in repr(settings) and "hidden-pw" not in str(settings)
    assert settings.space_logins() == {"a": Login("u", "hidden-pw")}


async def test_the_pool_logs_in_and_a_file_round_trips(
    locked: SpaceProcess, transport: str, tmp_path: Path
) -> None:
    """With POOL_SPACE_AUTH the Space is up: an upload, a predict and the download of
    its output file all pass Gradio's login_check, on either transport."""
    pool = _pool(locked, transport, POOL_PASSWORD)
    try:
        done = await pool.predict("/flip", file_arg(png(tmp_path)), download_to=tmp_path / "out")
        assert isinstance(done.result, LocalFile)
        with Image.open(done.result.path) as flipped:
            assert flipped.getpixel((3, 0)) == (255, 0, 0)
        assert (await pool.predict("/echo", "hi", 0)).result == "locked:hi"
    finally:
        await pool.aclose()


async def test_without_or_with_a_wrong_login_the_error_is_clear_and_leaks_nothing(
    locked: SpaceProcess, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No login, or a wrong password: an UpstreamError naming the credentials (no
    crash, no hang); the password is in no error, log or stats."""
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    for password in (None, WRONG):
        pool = _pool(locked, transport, password)
        try:
            with pytest.raises(UpstreamError, match="credentials") as caught:
                await pool.predict("/echo", "hi", 0)
            seen += [str(caught.value), repr(caught.value), json.dumps(await pool.stats())]
            seen.append(repr(pool.settings))
        finally:
            await pool.aclose()
    seen.append(caplog.text)
    assert not [text for text in seen if WRONG in text or POOL_PASSWORD in text]


async def test_a_restarted_space_is_logged_into_again(locked: SpaceProcess) -> None:
    """Gradio keeps its login tokens in memory: after a restart the native transport's
    next request is answered 401 and the pool logs in again by itself."""
    pool = _pool(locked, "native", POOL_PASSWORD)
    try:
        assert (await pool.predict("/echo", "a", 0)).result == "locked:a"
        locked.restart()
        assert (await pool.predict("/echo", "b", 0)).result == "locked:b"
    finally:
        await pool.aclose()
