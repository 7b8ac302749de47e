"""Files in a Space's inputs and outputs.

Out: a file in a result arrives as Gradio's ``FileData`` dict — ``{"path": <path on
the Space>, "url": …, "orig_name": …, "size": …, "meta": {"_type": …}}``,
nested anywhere in the output. :func:`fetch` downloads one through the connection's
client (:meth:`pool.transport.SpaceClient.download`), with the call's headers, bounded in bytes
and time, into a folder of the caller's, and returns a :class:`LocalFile`;
:meth:`PooledClient.download` does it for every file of a result while the lease is
held, and ``Pool.predict(download_to=...)`` on top of that.

The file's address is built from the connection's own Space URL and the ``path``
(as gradio_client does); a ``url`` the Space sends is used only when it points at the
same origin, and redirects are followed only within that origin, so a result cannot
make the pool fetch anything else.

In: :func:`pool.transport.file_arg` (``gradio_client.handle_file``) — a local path
uploaded to the Space when the job starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .._exceptions import UpstreamFileError
from ..transport import Redirected, ShortBody, SpaceClient, TooLarge, safe_name

_MAX_DEPTH = 64


@dataclass(frozen=True)
class LocalFile:
    """A Space's output file, downloaded to this host."""

    path: Path
    name: str  # the Space's file name, made safe (no directories, no control characters)
    size: int
    mime_type: str
    source: dict[str, Any]  # the Space's FileData as it came

    def read_bytes(self) -> bytes:
        return self.path.read_bytes()


def is_file_data(value: Any) -> bool:
    """Gradio's rule for a file object (``gradio_client.utils.is_file_obj_with_meta``)."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("path"), str)
        and isinstance(value.get("meta"), dict)
        and value["meta"].get("_type") == "gradio.FileData"
    )


def files_in(value: Any) -> list[dict[str, Any]]:
    """Every FileData dict nested in ``value`` (iterative, bounded depth)."""
    found: list[dict[str, Any]] = []
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > _MAX_DEPTH:
            continue
        if is_file_data(item):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((child, depth + 1) for child in item)
    return found


def replace_files(value: Any, replace: Callable[[dict[str, Any]], Any], depth: int = 0) -> Any:
    """``value`` with every FileData dict replaced by ``replace(it)``; tuples stay tuples."""
    if depth > _MAX_DEPTH:
        return value
    if is_file_data(value):
        return replace(value)
    if isinstance(value, dict):
        return {k: replace_files(v, replace, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [replace_files(v, replace, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(replace_files(v, replace, depth + 1) for v in value)
    return value


async def fetch(
    client: SpaceClient,
    data: dict[str, Any],
    directory: str | os.PathLike[str],
    *,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
    http: httpx.AsyncClient | None = None,
) -> LocalFile:
    """Download one FileData through ``client`` into ``directory``.

    Raises :class:`~pool.UpstreamFileError` (``kind`` ``file_too_large`` or
    ``file_fetch``); a partial file is removed. The caller bounds the time.
    """
    name = safe_name(data.get("orig_name") or data["path"])
    try:
        got = await client.download(data, directory, max_bytes=max_bytes, headers=headers,
                                    http=http)  # fmt: skip
    except TooLarge:
        raise _too_large(max_bytes) from None
    except (ShortBody, Redirected) as exc:
        raise UpstreamFileError(f"an output file could not be fetched: {exc}") from exc
    except httpx.HTTPStatusError as exc:
        raise UpstreamFileError(
            f"the Space answered HTTP {exc.response.status_code} for an output file"
        ) from exc
    except httpx.HTTPError as exc:
        raise UpstreamFileError(f"could not fetch an output file ({type(exc).__name__})") from exc
    return LocalFile(got.path, name, got.size, got.mime_type, dict(data))


def _too_large(limit: int) -> UpstreamFileError:
    return UpstreamFileError(
        f"an output file is larger than {limit} bytes (POOL_FILE_MAX_BYTES)",
        kind="file_too_large",
    )
