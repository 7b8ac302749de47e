"""File addresses and names: pure functions shared by upload and download."""

from __future__ import annotations

import mimetypes
import os
import re
import secrets
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]+")
_CHUNK = 64 * 1024
_MAX_REDIRECTS = 3


class SpaceFile(dict[str, Any]):
    """A FileData that names a file already on the Space (an earlier output): sent to
    it exactly as it is, never uploaded from this host.

    The service wraps every FileData an HTTP caller sends in one (``app/edge/_boundary.py``):
    a plain FileData dict is what ``handle_file`` makes for a *local* file, which the
    transport uploads, so a caller's ``{"path": "/etc/hostname", ...}`` would otherwise
    be read from this host's disk. A JSON body can only make plain dicts, so no caller
    can forge this marker; library code that names its own local files keeps using
    ``handle_file``/``file_arg`` (trusted, uploaded)."""

    __slots__ = ()


def space_files_in(value: Any, depth: int = 0) -> bool:
    """Whether any :class:`SpaceFile` is nested in ``value`` (bounded depth)."""
    if depth > 64:
        return False
    if isinstance(value, SpaceFile):
        return True
    if isinstance(value, dict):
        return any(space_files_in(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(space_files_in(v, depth + 1) for v in value)
    return False


class Downloaded:
    """A file written by :func:`download_to`."""

    __slots__ = ("mime_type", "path", "size")

    def __init__(self, path: Path, size: int, mime_type: str) -> None:
        self.path, self.size, self.mime_type = path, size, mime_type


class Redirected(Exception):
    """The Space redirected a file request to another origin (not followed)."""


class TooLarge(Exception):
    """A file is larger than the limit the caller set."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"larger than {limit} bytes")
        self.limit = limit


def safe_name(name: str | None, fallback: str = "file") -> str:
    """A file name with no directory part and only harmless characters."""
    base = os.path.basename((name or "").replace("\\", "/"))
    base = _UNSAFE_NAME.sub("_", base).strip(" .")[:128]
    return base or fallback


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port


def file_url(prefixed: str, data: dict[str, Any]) -> str:
    """Where the Space serves ``data``: its ``file=`` route under the API prefix
    (gradio_client client.py ``Endpoint._download_file``), or the ``url`` it sent when
    that is on the same origin — a result cannot make us fetch anything else."""
    root = prefixed.rstrip("/") + "/"
    given = data.get("url")
    if isinstance(given, str) and given:
        try:
            absolute = httpx.URL(root).join(given)
            if _origin(absolute) == _origin(httpx.URL(root)):
                return str(absolute)
        except httpx.InvalidURL:
            pass
    return root + "file=" + urllib.parse.quote(data["path"], safe="/")


async def download_to(
    http: httpx.AsyncClient,
    url: str,
    directory: str | os.PathLike[str],
    name: str,
    *,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
    timeout: httpx.Timeout | None = None,
) -> Downloaded:
    """GET ``url`` into a new file named after ``name`` in ``directory``, following
    redirects within its origin only; :class:`TooLarge` past ``max_bytes``,
    :class:`Redirected`, or httpx's errors. The file is removed on any failure."""
    folder = Path(directory)
    os.makedirs(folder, exist_ok=True)
    target = folder / f"{secrets.token_hex(8)}-{name}"
    current = httpx.URL(url)
    try:
        for _ in range(_MAX_REDIRECTS + 1):
            async with http.stream("GET", current, headers=dict(headers or {}),
                                   timeout=timeout or http.timeout) as response:  # fmt: skip
                if response.is_redirect and "location" in response.headers:
                    current = current.join(response.headers["location"])
                    if _origin(current) != _origin(httpx.URL(url)):
                        raise Redirected("the Space redirected a file elsewhere")
                    continue
                response.raise_for_status()
                announced = response.headers.get("content-length", "")
                if announced.isdigit() and int(announced) > max_bytes:
                    raise TooLarge(max_bytes)
                size = 0
                with target.open("wb") as out:
                    async for chunk in response.aiter_bytes(_CHUNK):
                        size += len(chunk)
                        if size > max_bytes:
                            raise TooLarge(max_bytes)
                        out.write(chunk)
                mime = response.headers.get("content-type", "").split(";")[0].strip()
                if not mime or mime == "application/octet-stream":
                    mime = mimetypes.guess_type(name)[0] or "application/octet-stream"
                return Downloaded(target, size, mime)
        raise httpx.TooManyRedirects("too many redirects for an output file")
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def file_arg(path: str | os.PathLike[str], name: str | None = None) -> dict[str, Any]:
    """A file argument for a Space (``gradio_client.handle_file``): uploaded on submit,
    under ``name`` (sanitized: no folders) when given — the app sees that name (native
    transport; the fallback ``gradio_client.Client`` uploads under the path's own name)."""
    from gradio_client import handle_file

    data: dict[str, Any] = handle_file(os.fspath(path))
    if name:
        data["orig_name"] = safe_name(name)
    return data


def is_url(path: str) -> bool:
    """Whether ``path`` is an http(s) URL, by gradio_client's rule
    (``utils.is_http_url_like``), which the Space applies to a FileData path too."""
    from gradio_client import utils

    return bool(utils.is_http_url_like(path))
