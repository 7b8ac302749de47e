"""Output files kept for HTTP callers, served at ``GET /api/files/{token}`` (app/api/_files.py).

A file in a Space's result is fetched by the pool while the request's slot is held
(``Pool.predict(download_to=...)``, bounded by ``POOL_FILE_MAX_BYTES`` and
``POOL_FILE_TIMEOUT_S``) into ``<POOL_FILE_DIR>/partial``; rendering the result
(:func:`app.edge._schemas.to_jsonable` with a :class:`FileOutput`) then either inlines it
as base64 (``"files": "inline"``, up to ``POOL_FILE_INLINE_MAX_BYTES``) or publishes
it here and puts a URL in the JSON.

Layout of ``POOL_FILE_DIR`` (default ``<tmp>/spacepool/files``, beside the default
SQLite coordinator, so every worker on the host shares it)::

    data/<sha256(token)>        the bytes
    data/<sha256(token)>.json   name, mime type, size, created, expires (wall clock)
    partial/…                   downloads not yet published (swept after a day)
    incoming/<random>/…         a request's uploaded files (deleted when it ends)

The token (32 random bytes, URL-safe) is never written to disk: the file is named
after its hash, so a worker that did not issue the token serves it just as well, and
a directory listing reveals no URL. A token that is not of the token's shape is a 404
before the disk is touched; nothing outside ``data/`` is ever opened.

A file belongs to the API key it was made under (a Space's output for that key's call,
or that key's upload; ``team`` in its metadata): to a caller of another key — or of
none — its token is unknown (404), as any unknown token (issue 38).

Files are deleted once expired (``POOL_FILE_TTL_S``; an expired one is a 404 even
before the sweep) and, when ``data/`` holds more than ``POOL_FILE_MAX_TOTAL_BYTES``,
oldest first (a team's over its equal share of that bound before anyone else's) —
by a sweep in a worker thread right after every publish (one at a time)
and every minute, so the event loop never scans the folder.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import mimetypes
import os
import re
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal

from pool import LocalFile
from pool.admission import current as current_consumer

from ..core import UploadTooLarge

_log = logging.getLogger("spacepool.app")
TOKEN_SHAPE = r"[A-Za-z0-9_-]{43}"
TOKEN_PATTERN = re.compile(rf"^{TOKEN_SHAPE}$")
FilesMode = Literal["url", "inline"]
SWEEP_EVERY_S = 60.0
_STALE_S = 86_400.0  # partial downloads and upload folders left behind by a crash


def _private(path: str, flags: int) -> int:
    """``open``'s opener for files only this service's user may read (0600)."""
    return os.open(path, flags, 0o600)


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _team() -> str | None:
    """The API key id of the current caller (None: no key): whose files are theirs."""
    consumer = current_consumer()
    return None if consumer is None else consumer.key_id


def _key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class FileStore:
    """The download folder: publish, look up, sweep. Plain methods; disk work is short."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        ttl_s: float,
        max_total_bytes: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = Path(directory)
        self.data = self.root / "data"
        self.partial = self.root / "partial"
        self.incoming = self.root / "incoming"
        self.ttl_s = ttl_s
        self.max_total_bytes = max_total_bytes
        self._clock = clock
        self._sweeping: asyncio.Task[None] | None = None
        self._again = False
        for folder in (self.data, self.partial, self.incoming):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)

    def publish(self, local: LocalFile) -> dict[str, Any]:
        """Move ``local`` into the store; its public description, with the URL."""
        token, expires = self.keep(local)
        return {
            "url": f"/api/files/{token}",
            "name": local.name,
            "size": local.size,
            "mime_type": local.mime_type,
            "expires_at": _iso(expires),
        }

    def keep(self, local: LocalFile) -> tuple[str, float]:
        """Move ``local`` into the store (0600); its token and when it expires."""
        token = secrets.token_urlsafe(32)
        key = _key(token)
        now = self._clock()
        expires = now + self.ttl_s
        meta = {
            "name": local.name,
            "mime_type": local.mime_type,
            "size": local.size,
            "created": now,
            "expires": expires,
            "team": _team(),
        }
        os.chmod(local.path, 0o600)
        os.replace(local.path, self.data / key)
        sidecar = self.data / f"{key}.json.tmp"
        with open(sidecar, "w", opener=_private) as out:
            out.write(json.dumps(meta))
        os.replace(sidecar, self.data / f"{key}.json")
        self.sweep_soon()
        return token, expires

    async def receive(self, chunks: AsyncIterator[bytes], name: str, max_bytes: int) -> LocalFile:
        """A caller's upload written to ``partial/`` (0600), at most ``max_bytes``
        (:class:`~app.core._errors.UploadTooLarge` past it, nothing left behind); publish it
        next."""
        target = self.partial / secrets.token_hex(16)
        size = 0
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:
                        raise UploadTooLarge(
                            f"an upload is larger than {max_bytes} bytes (POOL_MAX_UPLOAD_BYTES)"
                        )
                    out.write(chunk)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        mime = mimetypes.guess_type(name)[0] or "application/octet-stream"
        return LocalFile(target, name, size, mime, {})

    def local(self, token: str) -> tuple[Path, str] | None:
        """The stored file of ``token`` and its name (None: unknown or expired), for
        sending it on to a Space."""
        found = self._meta(token)
        if found is None:
            return None
        key, meta = found
        return self.data / key, str(meta.get("name") or "file")

    def open(self, token: str) -> tuple[IO[bytes], dict[str, Any]] | None:
        """The open file and its metadata, or None (unknown, expired, not a token)."""
        found = self._meta(token)
        if found is None:
            return None
        key, meta = found
        try:
            # Opened before answering: a sweep deleting it meanwhile cannot cut the reply.
            return (self.data / key).open("rb"), meta
        except OSError:
            return None

    def _meta(self, token: str) -> tuple[str, dict[str, Any]] | None:
        """The key and metadata of a live file (None: unknown, expired, not a token)."""
        if not TOKEN_PATTERN.fullmatch(token):
            return None
        key = _key(token)
        try:
            meta = json.loads((self.data / f"{key}.json").read_text())
            if float(meta["expires"]) <= self._clock():
                self._delete(key)
                return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if meta.get("team") != _team():  # another team's file: as unknown
            return None
        return key, meta

    def _delete(self, key: str) -> None:
        for path in (self.data / f"{key}.json", self.data / key):
            with contextlib.suppress(OSError):
                path.unlink()

    def sweep_soon(self) -> None:
        """Enforce the bound right after a publish: one sweep in a worker thread at a
        time (another follows if files were published meanwhile); inline without a loop."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.sweep()
            return
        if self._sweeping is not None and not self._sweeping.done():
            self._again = True
            return
        self._sweeping = loop.create_task(self._sweep_in_thread())

    async def _sweep_in_thread(self) -> None:
        while True:
            self._again = False
            try:
                await asyncio.to_thread(self.sweep)
            except Exception:
                _log.warning("file sweep failed", exc_info=True)
            if not self._again:
                return

    async def aclose(self) -> None:
        """Wait for a sweep in progress (the service is stopping)."""
        task = self._sweeping
        if task is not None and not task.done():
            with contextlib.suppress(Exception):
                await task

    def sweep(self) -> None:
        """Delete expired files, then the oldest while over the disk bound; stale leftovers."""
        now = self._clock()
        entries: list[tuple[float, str, int, str | None]] = []  # (created, key, size, team)
        keys_with_meta: set[str] = set()
        with contextlib.suppress(OSError), os.scandir(self.data) as listing:
            for entry in listing:
                if not entry.name.endswith(".json"):
                    continue
                key = entry.name[: -len(".json")]
                keys_with_meta.add(key)
                try:
                    meta = json.loads(Path(entry.path).read_text())
                    expires, created = float(meta["expires"]), float(meta["created"])
                    size = (self.data / key).stat().st_size
                    team = meta.get("team")
                except (OSError, ValueError, KeyError, TypeError):
                    self._delete(key)
                    continue
                if expires <= now:
                    self._delete(key)
                else:
                    entries.append((created, key, size, None if team is None else str(team)))
        self._evict(sorted(entries))
        self._sweep_leftovers(now, keys_with_meta)

    def _evict(self, entries: list[tuple[float, str, int, str | None]]) -> None:
        """While over ``max_total_bytes``: the oldest file of a team (API key; None:
        no key) over its equal share of the bound (÷ the teams holding files) first,
        then the oldest of all — one team's files never push out another's while it
        holds more than its share (issue 38)."""
        total = sum(size for _, _, size, _ in entries)
        held: dict[str | None, int] = {}
        for _, _, size, team in entries:
            held[team] = held.get(team, 0) + size
        left = list(entries)
        while left and total > self.max_total_bytes:
            share = self.max_total_bytes / len(held)
            over = next((e for e in left if held[e[3]] > share), left[0])
            left.remove(over)
            _, key, size, team = over
            self._delete(key)
            total -= size
            held[team] -= size
            if not held[team]:
                del held[team]

    def _sweep_leftovers(self, now: float, keys_with_meta: set[str]) -> None:
        with contextlib.suppress(OSError), os.scandir(self.data) as listing:
            for entry in listing:
                name = entry.name
                bare = name.removesuffix(".json.tmp")
                orphan = not name.endswith(".json") and bare not in keys_with_meta
                with contextlib.suppress(OSError):
                    if orphan and now - entry.stat().st_mtime > 60:  # a publish takes ms
                        os.unlink(entry.path)
        for folder in (self.partial, self.incoming):
            with contextlib.suppress(OSError), os.scandir(folder) as listing:
                for entry in listing:
                    with contextlib.suppress(OSError):
                        if now - entry.stat().st_mtime > _STALE_S:
                            if entry.is_dir(follow_symlinks=False):
                                shutil.rmtree(entry.path, ignore_errors=True)
                            else:
                                os.unlink(entry.path)

    def usage(self) -> tuple[int, int]:
        """(files, bytes) published now."""
        count = size = 0
        with contextlib.suppress(OSError), os.scandir(self.data) as listing:
            for entry in listing:
                if not entry.name.endswith(".json"):
                    with contextlib.suppress(OSError):
                        size += entry.stat().st_size
                        count += 1
        return count, size


@dataclass(frozen=True)
class FileOutput:
    """How one request wants its output files: URLs, or inline when small."""

    store: FileStore
    mode: FilesMode = "url"
    inline_max_bytes: int = 0

    def render(self, local: LocalFile) -> dict[str, Any]:
        """The JSON for one output file; never raises (to_jsonable's promise)."""
        try:
            if self.mode == "inline" and local.size <= self.inline_max_bytes:
                data = local.read_bytes()
                local.path.unlink(missing_ok=True)
                return {
                    "file": {
                        "b64": base64.b64encode(data).decode(),
                        "name": local.name,
                        "size": local.size,
                        "mime_type": local.mime_type,
                    }
                }
            return {"file": self.store.publish(local)}
        except OSError as exc:
            _log.warning("could not keep an output file (%s)", type(exc).__name__)
            with contextlib.suppress(OSError):
                local.path.unlink(missing_ok=True)
            return {"file": describe_file(local) | {"error": "unavailable"}}


def describe_file(local: LocalFile) -> dict[str, Any]:
    """Name, size and type only (no path of this host)."""
    return {"name": local.name, "size": local.size, "mime_type": local.mime_type}


async def run_sweeper(store: FileStore) -> None:
    """Sweep every minute (expiry, the disk bound, leftovers), off the event loop."""
    while True:
        await asyncio.sleep(min(SWEEP_EVERY_S, max(1.0, store.ttl_s / 2)))
        try:
            await asyncio.to_thread(store.sweep)
        except Exception:
            _log.warning("file sweep failed", exc_info=True)
