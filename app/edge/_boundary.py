"""The trust boundary: what an HTTP caller sends, checked the same way on both faces.

The JSON API (``/api/predict``, ``/api/jobs``) and the Gradio front (``/gradio/…``)
each parse their own wire format, then hand the caller's values to the functions
here, so a rule cannot exist on one face only (docs/security.md):

* :func:`parse_json` — a body of bounded nesting (deeper is a 422, never a 500 from
  a recursion limit further on);
* :meth:`Boundary.values` — every Gradio ``FileData`` among the values is either an
  upload this service received (its opaque id, :data:`UPLOAD_PREFIX`), an http(s)
  URL where ``POOL_ALLOW_FILE_URLS`` allows it, or a Space's output file this
  service relayed to a caller, sent to the Space unchanged as a
  :class:`pool.transport.SpaceFile`; anything else is a 422
  ``invalid_file_reference``. Nothing is ever read
  from this host's disk because a caller named it. A plain FileData dict is what
  ``handle_file`` makes for a *local* file: passed on as it came, the transport
  would upload whatever path a caller named (``/etc/hostname``,
  ``/proc/self/environ``), and a Space sharing the host could read it too.

The outbound secret guard is the pool's (``PooledClient``, both faces reach it).
"""

from __future__ import annotations

import json
import re
from typing import Any

from cachetools import TTLCache

from pool import InvalidRequest, file_arg, is_file_data
from pool.connections import files_in
from pool.transport import SpaceFile, is_url, safe_name

from ..core import InvalidFileReference
from ._files import TOKEN_SHAPE, FileStore
from ._schemas import MAX_DEPTH, json_problem

UPLOAD_PREFIX = "spacepool-upload/"
"""The ``path`` of a file uploaded to the front: ``spacepool-upload/<token>/<name>``
(an opaque id: no path of this host; the token is the capability)."""
_UPLOAD_ID = re.compile(rf"^{re.escape(UPLOAD_PREFIX)}({TOKEN_SHAPE})/([^/]{{0,255}})$")


class BadJson(ValueError):
    """A body that is not JSON (the front answers 400, the JSON API 422)."""


def parse_json(raw: bytes | str) -> Any:
    """``raw`` parsed: nested at most ``MAX_DEPTH`` levels, finite numbers (the JSON
    API's rule, :func:`app.edge._schemas.json_problem`; else InvalidRequest)."""
    try:
        value = json.loads(raw)
    except (RecursionError, UnicodeDecodeError, ValueError) as exc:
        raise BadJson(f"the body is not JSON ({type(exc).__name__})") from None
    if (problem := json_problem(value)) is not None:
        raise InvalidRequest(f"the body: {problem}")
    return value


def upload_id(token: str, name: str) -> str:
    """The opaque ``path`` the front answers for an upload (:data:`UPLOAD_PREFIX`)."""
    return f"{UPLOAD_PREFIX}{token}/{safe_name(name)}"


def upload_token(path: str) -> str | None:
    """The store token of an upload id, or None when ``path`` is not one."""
    match = _UPLOAD_ID.fullmatch(path)
    return match.group(1) if match else None


class Boundary:
    """The file rule of both faces (module docstring): this service's uploads (its
    file ``store``), the Spaces' own output files this process relayed to a caller
    (:meth:`saw_outputs`: only those may be named back, so no caller can make a Space
    read a path of its choosing either), and URLs where ``allow_urls``."""

    def __init__(
        self, store: FileStore, *, allow_urls: bool, outputs_ttl_s: float,
        max_outputs: int = 100_000,
    ) -> None:  # fmt: skip
        self.store = store
        self.allow_urls = allow_urls
        self.outputs_ttl_s = outputs_ttl_s
        self._outputs: TTLCache[str, bool] = TTLCache(maxsize=max_outputs, ttl=outputs_ttl_s)

    def saw_outputs(self, value: Any) -> list[str]:
        """Remember the Space-side paths of the files in an output sent to a caller;
        those paths (another process of the fleet is told of them: the Gradio front)."""
        paths = [str(data["path"]) for data in files_in(value) if not is_url(data["path"])]
        self.note_outputs(paths)
        return paths

    def note_outputs(self, paths: list[str]) -> None:
        """Space-side paths of output files relayed to a caller (here or elsewhere)."""
        for path in paths:
            self._outputs[path] = True

    def unknown_outputs(self, value: Any) -> list[str]:
        """The paths among ``value``'s FileData that are neither an upload id nor a URL
        nor an output known here (another process may have relayed them)."""
        found = []
        for data in files_in(value):
            path = str(data["path"])
            if upload_token(path) is None and not is_url(path) and path not in self._outputs:
                found.append(path)
        return found

    def values(self, value: Any, where: str) -> Any:
        """``value`` with each FileData an HTTP caller sent made safe to send;
        InvalidFileReference (422) for one that is none of the three kinds."""
        return self._walk(value, where, 0)

    def _walk(self, value: Any, where: str, depth: int) -> Any:
        if depth > MAX_DEPTH + 1:
            raise InvalidRequest(f"{where}: nested deeper than {MAX_DEPTH} levels")
        if is_file_data(value):
            return self._file(value, where)
        if isinstance(value, list):
            return [self._walk(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {k: self._walk(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
        return value

    def _file(self, data: dict[str, Any], where: str) -> Any:
        path = str(data["path"])
        token = upload_token(path)
        if token is not None:
            local = self.store.local(token)
            if local is None:
                raise InvalidFileReference(
                    f"{where}: no upload {path[:96]!r} here (unknown or expired)"
                )
            file, name = local
            return file_arg(file, str(data.get("orig_name") or name))
        if is_url(path):
            if not self.allow_urls:
                raise InvalidFileReference(
                    f"{where}: file URLs are not accepted here (POOL_ALLOW_FILE_URLS is off);"
                    " upload the file to this service first"
                )
            return dict(data)  # the Space fetches it; nothing is read here
        if path in self._outputs:
            return SpaceFile(data)  # a Space's own output, named back: sent unchanged
        raise InvalidFileReference(
            f"{where}: a file input must be uploaded to this service first"
            " (or be a Space's output file this service gave you)"
        )
