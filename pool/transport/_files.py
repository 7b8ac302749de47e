"""File addresses and names: pure functions shared by upload and download."""

from __future__ import annotations

import os
import re
import urllib.parse
from typing import Any

import httpx

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]+")


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
