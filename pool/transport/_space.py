"""One Space's HTTP side: a single ``httpx.AsyncClient``, its config, its files.

Every request to a Space goes through one client (keep-alive connections); the client
keeps no cookie: a replicated Space's affinity cookies are kept per upstream session
(:mod:`._affinity`), and the Space's own requests carry its ``home`` jar's.
The client's limits follow the pool's rule of ``min_size``–``max_size`` sessions per
Space: a running session holds its data stream and, where a call needs it, its
heartbeat, and makes short requests (join, upload, cancel, download) beside them, so
up to three connections per session may be open. Every one of them may stay alive
between requests: a keep-alive cap below the connections in use closes a connection
each time a busy session's request ends and opens a new one for the next (measured:
~2.3 new TCP connections per call at saturation with the cap at ``3 × min_size``).
Idle ones close after ``keepalive_expiry``; ``min_size`` (what the pool keeps warm) is
accepted for symmetry and sets no limit here.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import os
import ssl
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
from gradio_client import utils
from gradio_client.exceptions import AuthenticationError

from .._spaces import Login
from ._affinity import Affinity, no_cookies
from ._app import AppInfo
from ._files import Downloaded, download_to, file_url, safe_name
from ._login import LOGIN_PATH, GradioLogin

_CONNS_PER_SESSION = 3
# Idle connections close after this; below uvicorn's default keep-alive timeout (5 s),
# so that the client, not the server, ends an idle connection.
_KEEPALIVE_S = 4.0
# The longest wait for a heartbeat when measuring the cadence (Gradio's default is 15 s).
_PROBE_READ_S = 60.0
_PROBE_EVERY_S = 60.0  # measures of one Space start at most this often
# Failures of a request that reused a kept-alive connection the server had closed:
# the request never reached it, so it is safe to send again on a fresh connection.
_STALE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class RateLimited(utils.TooManyRequestsError):  # type: ignore[misc]
    """The Hub answered 429 (gradio_client raises ``TooManyRequestsError`` there);
    ``retry_after_s``: the wait its ``Retry-After`` header names, if any. ``asked``
    False: nothing was asked — an earlier 429's wait is not over (no new failure)."""

    def __init__(self, retry_after_s: float | None, *, asked: bool = True) -> None:
        super().__init__("Too many requests to the API (429).")
        self.retry_after_s = retry_after_s
        self.asked = asked


def retry_after(response: httpx.Response) -> float | None:
    """The ``Retry-After`` of ``response`` in seconds (delta-seconds or an HTTP date)."""
    raw = response.headers.get("retry-after", "").strip()
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Cadence:
    """How often the Space writes a heartbeat (Gradio's ``GRADIO_HEARTBEAT_INTERVAL``,
    gradio/utils.py ``get_heartbeat_rate``: 15 s by default, 0.25 s in its e2e mode) on
    its heartbeat stream and, while it waits, its data stream (gradio/routes.py
    ``heartbeat``, ``queue_data``): the gap between two beats of one stream, as last
    measured; None until a stream has carried two."""

    def __init__(self) -> None:
        self.interval_s: float | None = None

    def stream(self) -> Callable[[], None]:
        """What one stream calls at each beat it carries."""
        last: float | None = None

        def beat() -> None:
            nonlocal last
            now = time.monotonic()
            if last is not None:
                self.interval_s = now - last
            last = now

        return beat


class ShortBody(Exception):
    """A file body ended before the ``size`` its FileData announced."""


class SpaceTransport:
    """The HTTP client of one Space and its cached :class:`AppInfo` (per ``app_id``)."""

    def __init__(
        self,
        src: str,
        *,
        token: str | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
        min_size: int = 5,
        max_size: int = 50,
        verify: ssl.SSLContext | bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        login: Login | None = None,
    ) -> None:
        self.src = src if src.endswith("/") else src + "/"
        # Gradio's own login (_login.py): the client's auth, when the Space has one
        self._login = GradioLogin(login, self.src + LOGIN_PATH) if login is not None else None
        headers = {"user-agent": "spacepool"}
        if token:  # as gradio_client sends it: the Hub strips `authorization`
            headers["x-hf-authorization"] = f"Bearer {token}"
        self.timeout = httpx.Timeout(connect_timeout_s, read=read_timeout_s)
        self.http = httpx.AsyncClient(
            headers=headers,
            cookies=no_cookies(),
            timeout=self.timeout,
            verify=verify,
            limits=httpx.Limits(
                max_connections=_CONNS_PER_SESSION * max_size,
                max_keepalive_connections=_CONNS_PER_SESSION * max_size,
                keepalive_expiry=_KEEPALIVE_S,
            ),
            transport=transport,
            auth=self._login,
        )
        if self._login is not None:
            self._login.bind(self.http)
        self.home = Affinity()  # /config's replica: the Space's own requests and probes
        self.cadence = Cadence()  # of the Space's heartbeats, as its streams show it
        self._probe: asyncio.Task[None] | None = None  # measuring it (measure_cadence)
        self._probe_after = 0.0  # monotonic: no new measure before (one failed)
        self._app: AppInfo | None = None
        self._loading: asyncio.Lock | None = None
        self._limited_until = 0.0  # monotonic: a 429's Retry-After, no /config before

    @property
    def app(self) -> AppInfo | None:
        """The last :class:`AppInfo` read (None before the first :meth:`load`)."""
        return self._app

    async def load(self) -> AppInfo:
        """The Space's :class:`AppInfo`: read once, then again only when its ``app_id``
        changed (one small ``gradio_api/app_id`` request checks)."""
        if self._loading is None:
            self._loading = asyncio.Lock()
        async with self._loading:
            wait = self._limited_until - time.monotonic()
            if wait > 0:  # honour the Hub's Retry-After: no request until it passed
                raise RateLimited(wait, asked=False)
            app = self._app
            if app is not None:
                response = await self.home.send(self.http, "GET", app.url("app_id"))
                response.raise_for_status()
                if response.json().get("app_id") == app.app_id:
                    return app
            self._app = await self._read()
            return self._app

    async def _read(self) -> AppInfo:
        # gradio_client client.py ``_get_config`` / ``_get_api_info``: GET {src}config,
        # then GET {prefix}/info?serialize=False.
        response = await self.home.send(self.http, "GET", self.src + utils.CONFIG_URL)
        if response.status_code == 401:
            needed = "refused the login" if self._login is not None else "needs a login"
            raise AuthenticationError(f"Could not load {self.src}: the Space {needed} (POOL_SPACE"
                                      "_AUTH; POOL_HF_TOKEN for a private Space)")  # fmt: skip
        if response.status_code == 429:
            raise self.rate_limited(response)
        response.raise_for_status()
        config = response.json()
        app = AppInfo(self.src, config, {})  # ProtocolNotSupported before asking for more
        info = await self.home.send(self.http, "GET", app.url(utils.RAW_API_INFO_URL))
        info.raise_for_status()
        return AppInfo(self.src, config, info.json())

    def rate_limited(self, response: httpx.Response) -> RateLimited:
        """The error for a 429; its Retry-After also holds back this Space's next
        ``/config`` (gradio_client ``TooManyRequestsError``; no reconnect storm)."""
        wait = retry_after(response)
        if wait:
            self._limited_until = max(self._limited_until, time.monotonic() + wait)
        return RateLimited(wait)

    async def upload(
        self, path: str, headers: Mapping[str, str], max_file_size: int | None,
        name: str | None = None, affinity: Affinity | None = None,
    ) -> str:  # fmt: skip
        """``POST upload`` of one local file (multipart field ``files``, gradio/routes.py
        ``upload_file``) under ``name`` (default: the file's own), the name the app will
        see (the Space keeps it as its path's last part); its path on the Space."""
        app = self._app or await self.load()
        # A local file: its size and chunks are read on the loop (short, no network).
        if max_file_size is not None and os.path.getsize(path) > max_file_size:  # noqa: ASYNC240
            raise ValueError(f"File {path} exceeds the maximum file size of {max_file_size} bytes")
        with open(path, "rb") as f:  # noqa: ASYNC230
            files = [("files", (safe_name(name or Path(path).name), f))]
            response = await (affinity or self.home).send(
                self.http, "POST", app.url(utils.UPLOAD_URL), headers, files=files)  # fmt: skip
        response.raise_for_status()
        return str(response.json()[0])

    async def download(
        self,
        data: dict[str, Any],
        directory: str | os.PathLike[str],
        *,
        max_bytes: int,
        headers: Mapping[str, str] | None = None,
        affinity: Affinity | None = None,
    ) -> Downloaded:
        """One output file into ``directory``, through this Space's client.

        A request that fails on a kept-alive connection the server closed is sent once
        more (the pool then opens a fresh one); a body shorter than the FileData's
        ``size`` raises :class:`ShortBody`; more than ``max_bytes``, :class:`TooLarge`.
        The file is removed on any failure; the caller bounds the time. ``affinity``:
        the session whose replica made the file (its cookies reach that replica).
        """
        app = self._app or await self.load()
        url = file_url(app.prefixed, data)
        headers = (affinity or self.home).headers(url, headers)
        name = safe_name(data.get("orig_name") or data["path"])
        try:
            got = await download_to(self.http, url, directory, name, max_bytes=max_bytes,
                                    headers=headers)  # fmt: skip
        except _STALE:
            got = await download_to(self.http, url, directory, name, max_bytes=max_bytes,
                                    headers=headers)  # fmt: skip
        announced = data.get("size")
        if isinstance(announced, int) and got.size < announced:
            got.path.unlink(missing_ok=True)
            raise ShortBody(f"got {got.size} of the {announced} bytes announced")
        return got

    def measure_cadence(self) -> None:
        """Measure the Space's heartbeat cadence (:attr:`cadence`) if none of its streams
        has shown it yet: one heartbeat stream of a session of its own, read for two
        beats and closed (to the Space, a visitor who opened the app and left), in the
        background, one at a time and at most once a minute."""
        app = self._app
        if self.cadence.interval_s is not None or app is None or self.http.is_closed:
            return
        if time.monotonic() >= self._probe_after:
            self._probe_after = time.monotonic() + _PROBE_EVERY_S
            self._probe = asyncio.get_running_loop().create_task(self._measure(app))

    async def _measure(self, app: AppInfo) -> None:
        url = app.url(utils.HEARTBEAT_URL.format(session_hash=uuid.uuid4().hex))
        timeout = httpx.Timeout(self.timeout.connect, read=_PROBE_READ_S)
        beat, seen = self.cadence.stream(), 0
        with contextlib.suppress(httpx.HTTPError):
            async with self.http.stream("GET", url, headers=self.home.headers(url),
                                        timeout=timeout) as response:  # fmt: skip
                if response.status_code != 200:
                    return
                async for _ in response.aiter_bytes():
                    beat()
                    seen += 1
                    if seen == 2:
                        return

    async def aclose(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(BaseException):
                await self._probe
        with contextlib.suppress(Exception):
            await self.http.aclose()
