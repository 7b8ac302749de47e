"""A stored file answered to a caller, by both faces (``/api/files/{token}``, the Gradio
front's ``file=``): single byte ranges honoured, and headers that keep whatever a caller
or a Space put in a file from running on this service's origin."""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import AsyncIterator
from typing import IO

from fastapi import HTTPException, Request
from fastapi.responses import StreamingResponse

from ..core import FileNotFound
from ._files import FileStore

_CHUNK = 64 * 1024


def file_response(
    store: FileStore, token: str, request: Request, *, inline_media: bool
) -> StreamingResponse:
    """The stored file of ``token`` (FileNotFound: 404), ranges honoured, inert."""
    opened = store.open(token)
    if opened is None:
        raise FileNotFound("no such file here (unknown or expired URL)")
    handle, meta = opened
    try:
        size = os.fstat(handle.fileno()).st_size
        span = byte_range(request.headers.get("range"), size)
    except BaseException:
        handle.close()
        raise
    mime = str(meta.get("mime_type") or "application/octet-stream")
    start, end = span or (0, size - 1)
    headers = {
        "Content-Length": str(end - start + 1),
        "Accept-Ranges": "bytes",
        **inert_headers(mime, str(meta.get("name") or "file"), inline_media=inline_media),
    }
    if span is not None:
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    return StreamingResponse(
        _read(handle, start, end - start + 1),
        status_code=206 if span is not None else 200,
        media_type=mime,
        headers=headers,
    )


def inline_safe(mime: str) -> bool:
    """A media type a browser only displays: images (SVG can script), audio, video."""
    kind = mime.split(";", 1)[0].strip().lower()
    return kind.startswith(("image/", "audio/", "video/")) and kind != "image/svg+xml"


def inert_headers(mime: str, name: str, *, inline_media: bool = True) -> dict[str, str]:
    """The headers of every file this service serves (its own store, the front's
    uploads, a Space's ``file=``): nothing a caller or a Space put in a file can run
    on this service's origin (the dashboard's admin token lives there). Never sniffed,
    sandboxed, and a download unless a media type that cannot script."""
    quoted = urllib.parse.quote(name, safe="")
    disposition = "inline" if inline_media and inline_safe(mime) else "attachment"
    return {
        "Content-Disposition": f"{disposition}; filename*=UTF-8''{quoted}",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox; default-src 'none'; style-src 'unsafe-inline';"
        " img-src 'self' data:; media-src 'self'",
        "Cache-Control": "private, no-store",
    }


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The (first, last) byte of a single-range ``Range`` header; None: the whole file.

    Raises a 416 (with ``Content-Range: bytes */size``) when it cannot be satisfied.
    """
    if not header:
        return None
    match = _RANGE.fullmatch(header.strip().replace(" ", ""))
    if match is None:
        return None  # several ranges or another unit: the whole file (RFC 9110 allows it)
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # the last n bytes
        length = min(int(last[:19]), size)
        if length == 0:
            raise _unsatisfiable(size)
        return size - length, size - 1
    start = int(first[:19])
    end = min(int(last[:19]), size - 1) if last else size - 1
    if start >= size or end < start:
        raise _unsatisfiable(size)
    return start, end


def _unsatisfiable(size: int) -> HTTPException:
    return HTTPException(416, "range not satisfiable", headers={"Content-Range": f"bytes */{size}"})


async def _read(handle: IO[bytes], start: int, length: int) -> AsyncIterator[bytes]:
    try:
        handle.seek(start)
        while length > 0 and (chunk := handle.read(min(_CHUNK, length))):
            length -= len(chunk)
            yield chunk
    finally:
        handle.close()
