"""Reading a predict or job request: a JSON body, or multipart with files.

``POST /api/predict`` and ``POST /api/jobs`` take either

* ``application/json``: the body of :class:`~app.edge._schemas.PredictRequest`, parsed the
  way FastAPI parses a JSON body (same 422/400 answers); or
* ``multipart/form-data``: a part ``body`` holding that JSON, plus file parts.

A *file argument* is an object whose only key is ``file``, anywhere in ``args`` or
``kwargs``, holding exactly one of:

* ``{"upload": "<part name>"}`` — a file part of this multipart request;
* ``{"b64": "<base64>", "name": "cat.png"}`` — the bytes inline (JSON or multipart);
* ``{"url": "https://..."}`` — fetched by the service, only when
  ``POOL_ALLOW_FILE_URLS`` is on (off by default: 422, so a caller cannot make the
  service reach into its own network).

A raw Gradio ``FileData`` (``{"path": …, "meta": {"_type": "gradio.FileData"}}``) is
checked by the trust boundary (:meth:`app.edge._boundary.Boundary.values`, the front's rule
too): an upload id of this service, a URL where allowed, else a file on the Space,
sent unchanged — never a file of this host.

Each file object becomes a temporary file ``<POOL_FILE_DIR>/incoming/<random>/<n>/<name>`` — a
folder of its own, under exactly the (sanitized) name the caller gave: the multipart
part's filename, the ``"name"`` of a base64 or URL file, else ``file`` — and, in the
arguments, ``pool.file_arg(path, name)``, which is uploaded to the Space under that
name when the job starts. All files of one request together are at
most ``POOL_MAX_UPLOAD_BYTES`` (413 ``too_large``); bad base64, an unknown part, a
malformed file object are a 422. The folder is deleted when the request (or the job)
ends, whatever the outcome: :meth:`CheckedCall.cleanup`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import email.message
import json
import secrets
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from pool import (
    InvalidRequest,
    Partial,
    Pool,
    Prediction,
    UpstreamEvent,
    WaitTicket,
    file_arg,
    is_file_data,
)
from pool.transport import safe_name

from ..core import ServiceSettings, UploadTooLarge
from ..edge import MAX_DEPTH, Boundary, PredictRequest, is_file_form

MAX_FILE_PARTS = 16
MAX_FORM_FIELDS = 4
_KEYS = frozenset({"upload", "b64", "url"})
_CHUNK = 64 * 1024
_URL_TIMEOUT = httpx.Timeout(10.0, read=30.0)
_URL_REDIRECTS = 3
_URL_TOTAL_S = 60.0  # a server trickling bytes cannot hold the request longer


@dataclass
class CheckedCall:
    """A validated request with its file arguments on disk, ready for the pool."""

    body: PredictRequest
    args: list[Any]
    kwargs: dict[str, Any]
    folder: Path | None = None
    bytes_in: int = 0
    # Sent with this call's upstream requests only (the caller's ZeroGPU identity when
    # POOL_FORWARD_IP_TOKEN is on); kept in memory for the call, never stored or shown.
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    _done: bool = field(default=False, repr=False)

    async def predict(
        self,
        pool: Pool,
        *,
        timeout: float,
        download_to: Path | None,
        queue_timeout_s: float | None = None,
        ticket: WaitTicket | None = None,
        on_admitted: Callable[[str], Awaitable[None]] | None = None,
        on_partial: Callable[[Partial], Awaitable[None]] | None = None,
        on_event: Callable[[UpstreamEvent], Awaitable[None]] | None = None,
    ) -> Prediction:
        """``pool.predict`` of this request, its file arguments in place (one place for
        the predict, the streamed predict and the job)."""
        body = self.body
        return await pool.predict(
            body.api_name,
            *self.args,
            email=body.email,
            space=body.space,
            kwargs=self.kwargs,
            timeout=timeout,
            queue_timeout_s=queue_timeout_s,
            safe_to_retry=body.safe_to_retry,
            ticket=ticket,
            priority=_priority(body),
            on_admitted=on_admitted,
            on_partial=on_partial,
            download_to=download_to,
            headers=self.headers or None,
            on_event=on_event,
            session=body.session,
        )

    def cleanup(self) -> None:
        """Delete the request's uploaded files (idempotent)."""
        if self.folder is not None and not self._done:
            self._done = True
            shutil.rmtree(self.folder, ignore_errors=True)


def _priority(body: PredictRequest) -> str | None:
    """The class the body asks for; None lets the pool take its API key's default
    (pool/_request.py), else interactive."""
    return body.priority if "priority" in body.model_fields_set else None


def checked_call(body: PredictRequest, boundary: Boundary) -> CheckedCall:
    """A body with no file objects (a job run again by another worker) as a
    :class:`CheckedCall`, through the trust boundary like the first run."""
    args, kwargs = boundary.values(body.args, "args"), boundary.values(body.kwargs, "kwargs")
    return CheckedCall(body, args, kwargs)


IP_TOKEN_HEADER = "x-ip-token"


def identity_headers(request: Request, settings: ServiceSettings) -> dict[str, str]:
    """The caller's headers to forward upstream: its ZeroGPU ``X-IP-Token`` (the Hub
    injects it into a calling Space's requests) when ``POOL_FORWARD_IP_TOKEN`` is on."""
    token = request.headers.get(IP_TOKEN_HEADER)
    if not settings.forward_ip_token or not token:
        return {}
    return {IP_TOKEN_HEADER: token}


def _media_type(request: Request) -> tuple[str, str]:
    message = email.message.Message()
    message["content-type"] = request.headers.get("content-type", "")
    return message.get_content_maintype(), message.get_content_subtype()


def _validated(data: Any) -> PredictRequest:
    try:
        return PredictRequest.model_validate(data)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


def _from_json(raw: bytes | str) -> PredictRequest:
    """As FastAPI does for a JSON body: 422 ``json_invalid``, 400 when unparseable."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error"}
        raise RequestValidationError([error]) from None
    except (RecursionError, UnicodeDecodeError, ValueError):
        raise HTTPException(400, "There was an error parsing the body") from None
    return _validated(data)


async def read_call(
    request: Request,
    settings: ServiceSettings,
    boundary: Boundary,
    check: Callable[[PredictRequest], object] | None = None,
) -> CheckedCall:
    """The request's body and its file arguments; raises the usual 4xx errors.

    ``check(body)`` runs once the body is valid and before any file is written or
    fetched, so a request refused anyway (an unknown Space) costs no disk or network.
    """
    kind, subtype = _media_type(request)
    if (kind, subtype) != ("multipart", "form-data"):
        raw = await request.body()
        if not raw:
            missing = {"type": "missing", "loc": ("body",), "msg": "Field required"}
            raise RequestValidationError([missing])
        is_json = kind == "application" and (subtype == "json" or subtype.endswith("+json"))
        body = _from_json(raw) if is_json else _validated(raw)
        if check is not None:
            check(body)
        return await _materialize(body, {}, settings, boundary)
    form = await request.form(
        max_files=MAX_FILE_PARTS, max_fields=MAX_FORM_FIELDS, max_part_size=settings.max_body_bytes
    )
    try:
        part = form.get("body")
        raw_body = (
            await part.read(settings.max_body_bytes + 1) if isinstance(part, UploadFile) else part
        )
        if not raw_body:
            missing = {"type": "missing", "loc": ("body", "body"), "msg": "part 'body' required"}
            raise RequestValidationError([missing])
        body = _from_json(raw_body)
        if check is not None:
            check(body)
        uploads: dict[str, UploadFile] = {}
        for name, value in form.multi_items():
            if isinstance(value, UploadFile) and name != "body":
                if name in uploads:
                    raise InvalidRequest(f"two file parts named {name[:64]!r}")
                uploads[name] = value
        return await _materialize(body, uploads, settings, boundary)
    finally:
        await form.close()


class _Files:
    """Writes one request's file arguments into its folder, counting bytes."""

    def __init__(
        self, settings: ServiceSettings, boundary: Boundary, uploads: dict[str, UploadFile]
    ) -> None:
        self.settings = settings
        self.boundary = boundary
        self.incoming = boundary.store.incoming
        self.uploads = uploads
        self.folder: Path | None = None
        self.total = 0
        self._count = 0
        self._copied: dict[str, dict[str, Any]] = {}

    def _target(self, name: str) -> Path:
        """Where a file named ``name`` goes: a folder of its own (``<n>/<name>``), so
        the Space sees exactly that name and equal names never collide."""
        if self.folder is None:
            self.folder = self.incoming / secrets.token_hex(12)
            self.folder.mkdir(parents=True, mode=0o700)
        self._count += 1
        own = self.folder / str(self._count)
        own.mkdir(mode=0o700)
        target = own / name
        target.touch(mode=0o600)  # private from its first byte (0600 in a 0700 folder)
        return target

    def _count_bytes(self, size: int) -> None:
        self.total += size
        self._check(self.total)

    def _check(self, total: int) -> None:
        if total > self.settings.max_upload_bytes:
            raise UploadTooLarge(
                f"the request's files are larger than {self.settings.max_upload_bytes} bytes"
                " (POOL_MAX_UPLOAD_BYTES)"
            )

    async def convert(self, spec: dict[str, Any], where: str) -> dict[str, Any]:
        keys = set(spec) & _KEYS
        extra = set(spec) - _KEYS - {"name"}
        if len(keys) != 1 or extra:
            raise InvalidRequest(
                f"{where}: a file object holds exactly one of 'upload', 'b64', 'url'"
                " (and optionally 'name')"
            )
        name = spec.get("name")
        if name is not None and (not isinstance(name, str) or len(name) > 255):
            raise InvalidRequest(f"{where}: file.name must be a string of at most 255 characters")
        (key,) = keys
        value = spec[key]
        if not isinstance(value, str) or not value:
            raise InvalidRequest(f"{where}: file.{key} must be a non-empty string")
        if key == "b64":
            return self._from_b64(value, name, where)
        if key == "upload":
            return await self._from_upload(value, name, where)
        return await self._from_url(value, name, where)

    def _from_b64(self, value: str, name: str | None, where: str) -> dict[str, Any]:
        self._check(self.total + len(value) * 3 // 4 - 2)  # before decoding anything big
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"{where}: file.b64 is not valid base64") from None
        self._count_bytes(len(data))
        target = self._target(safe_name(name))
        target.write_bytes(data)
        return file_arg(target, safe_name(name))

    async def _from_upload(self, part: str, name: str | None, where: str) -> dict[str, Any]:
        if part in self._copied:
            return self._copied[part]
        upload = self.uploads.get(part)
        if upload is None:
            raise InvalidRequest(f"{where}: no file part named {part[:64]!r} in this request")
        filename = safe_name(name or upload.filename)
        target = self._target(filename)
        with target.open("wb") as out:
            while chunk := await upload.read(_CHUNK):
                self._count_bytes(len(chunk))
                out.write(chunk)
        self._copied[part] = file_arg(target, filename)
        return self._copied[part]

    async def _from_url(self, url: str, name: str | None, where: str) -> dict[str, Any]:
        if not self.settings.allow_file_urls:
            raise InvalidRequest(
                f"{where}: file URLs are not accepted here (POOL_ALLOW_FILE_URLS is off);"
                " send the file as an upload or base64"
            )
        try:
            current = httpx.URL(url)
        except (httpx.InvalidURL, TypeError):
            raise InvalidRequest(f"{where}: file.url is not a valid URL") from None
        if current.scheme not in ("http", "https") or not current.host:
            raise InvalidRequest(f"{where}: file.url must be http(s)")
        filename = safe_name(name or current.path.rsplit("/", 1)[-1])
        target = self._target(filename)
        try:
            async with (
                asyncio.timeout(_URL_TOTAL_S),
                httpx.AsyncClient(timeout=_URL_TIMEOUT, trust_env=False) as http,
            ):
                for _ in range(_URL_REDIRECTS + 1):
                    async with http.stream("GET", current) as response:
                        if response.is_redirect and "location" in response.headers:
                            current = current.join(response.headers["location"])
                            if current.scheme not in ("http", "https"):
                                break
                            continue
                        if response.status_code != 200:
                            raise InvalidRequest(
                                f"{where}: fetching file.url answered HTTP {response.status_code}"
                            )
                        with target.open("wb") as out:
                            async for chunk in response.aiter_bytes(_CHUNK):
                                self._count_bytes(len(chunk))
                                out.write(chunk)
                        return file_arg(target, filename)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise InvalidRequest(
                f"{where}: could not fetch file.url ({type(exc).__name__})"
            ) from None
        raise InvalidRequest(f"{where}: file.url redirected too often or off http(s)")

    async def walk(self, value: Any, where: str, depth: int = 0) -> Any:
        if depth > MAX_DEPTH + 1:
            return value
        if is_file_form(value):
            return await self.convert(value["file"], where)
        if is_file_data(value):  # a raw Gradio FileData: the boundary's rule
            return self.boundary.values(value, where)
        if isinstance(value, list):
            return [await self.walk(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {k: await self.walk(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
        return value


async def _materialize(
    body: PredictRequest,
    uploads: dict[str, UploadFile],
    settings: ServiceSettings,
    boundary: Boundary,
) -> CheckedCall:
    files = _Files(settings, boundary, uploads)
    try:
        args = [await files.walk(a, f"args[{i}]") for i, a in enumerate(body.args)]
        kwargs = {k: await files.walk(v, f"kwargs.{k}") for k, v in body.kwargs.items()}
    except BaseException:
        if files.folder is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(files.folder, ignore_errors=True)
        raise
    return CheckedCall(body, args, kwargs, files.folder, files.total)
