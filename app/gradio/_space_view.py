"""What the front reads from the Spaces: their config and API, their files.

No admission here: reading a Space's config, API or a file runs nothing on it. All of
it comes through the pool's reads of what a Space serves without admission
(``Pool.space_app``, ``space_info``, ``space_file``: pool/_space_reads.py); the front
never checks out a connection nor touches a transport. The Space's own URLs never reach
the caller: every string that starts with the Space's address is rewritten to the
service's (:func:`rewriter`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import httpx

from pool import NoHealthySpaceError, Pool
from pool.transport import AppInfo, ProtocolNotSupported, safe_name

from ..edge import inert_headers
from ._front_errors import FrontUnavailable
from ._rewrite import rewriter

_PASSED_HEADERS = ("content-type", "content-length")


async def app_of(pool: Pool, name: str) -> AppInfo:
    """The Space's app as last read (the pool re-reads it when the Space restarts)."""
    try:
        return await pool.space_app(name)
    except ProtocolNotSupported:
        raise FrontUnavailable("the Gradio front needs POOL_TRANSPORT=native") from None


class SeveralApps(Exception):
    """The pool's scope (``/gradio/``) over Spaces of different apps: no one config is
    theirs; each app is served under ``/gradio/{alias}/``."""

    def __init__(self, apps: dict[str, list[str]]) -> None:
        listing = "; ".join(
            f"{app}: " + ", ".join(f"/gradio/{name}/" for name in names)
            for app, names in apps.items()
        )
        super().__init__(
            f"this service's Spaces are {len(apps)} different apps, so /gradio/ serves none"
            f" of them: use an app's own URL ({listing})"
        )
        self.apps = apps


async def served(pool: Pool, scope: str | None) -> tuple[str, AppInfo]:
    """The Space whose config a scope serves, and its app: the alias, or for the pool
    the first configured Space that answers when the pool's Spaces are replicas of one
    app (:class:`SeveralApps` otherwise)."""
    if scope is not None:
        return scope, await app_of(pool, scope)
    await pool.start()
    if len(pool.spaces) > 1:
        await pool.apps.discover(lambda name: True)  # each Space's API, once
        if len(apps := pool.apps.apps()) > 1:
            raise SeveralApps(apps)
    last: Exception | None = None
    for name, sp in pool.spaces.items():
        if not sp.is_up():
            continue
        try:
            return name, await app_of(pool, name)
        except FrontUnavailable:
            raise
        except Exception as exc:
            last = exc
    raise NoHealthySpaceError(
        f"no Space answers ({type(last).__name__ if last else 'all down'})", retry_after_s=5.0
    )


def front_config(app: AppInfo, front_root: str) -> dict[str, Any]:
    """The Space's config as the client must see it: ``root`` is the service's, so
    the JS client sends every later request to it (client/js/src/helpers/init_helpers.ts
    ``resolve_config``); no Space address left inside."""
    config = rewriter(app.src, front_root)(copy.deepcopy(app.config))
    config["root"] = front_root.rstrip("/")
    return dict(config)


async def front_info(
    pool: Pool, scope: str | None, params: Mapping[str, str], front_root: str
) -> tuple[int, Any]:
    """The served Space's ``info`` as it answers it (with the caller's query), rewritten."""
    name, app = await served(pool, scope)
    status, body = await pool.space_info(name, params)
    return status, rewriter(app.src, front_root)(body)


def file_headers(response: httpx.Response, path: str) -> dict[str, str]:
    """A Space's file as this service serves it: length and type passed on, made
    inert on this origin (:func:`app.edge._files.inert_headers`)."""
    mime = response.headers.get("content-type", "application/octet-stream")
    passed = {k: v for k in _PASSED_HEADERS if (v := response.headers.get(k)) is not None}
    if response.headers.get("content-encoding", "identity").lower() != "identity":
        # The body is relayed decoded (httpx's aiter_bytes): the Space's length is the
        # encoded one, and a longer body than the length said is cut by the server.
        passed.pop("content-length", None)
    return {**passed, **inert_headers(mime, safe_name(path.rsplit("/", 1)[-1]))}
