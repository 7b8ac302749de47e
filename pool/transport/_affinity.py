"""Replica affinity: the cookie jar of one upstream session.

A replicated Space on the Hub is reached at one address; the Hub keeps a client on one
replica through a cookie its first answer sets, and gradio_client sends the cookies
``/config`` set on every later request of that ``Client`` (client.py ``_get_config``:
``self.cookies = r.cookies``; ``cookies=self.cookies`` on joins, streams, uploads and
``Endpoint._download_file``). Here the jar belongs to one upstream session, not to the
Space: a session is pinned to the replica its first request reached and keeps it for its
joins, data stream, heartbeat, cancels, uploads and downloads (its ``gr.State`` and its
files live there), while sessions started later are spread over the replicas by the Hub.
The Space's own requests (``/config``, ``info``, ``app_id`` checks, health probes) use
the Space's *home* jar, so they keep asking one replica.

The Space's shared ``httpx.AsyncClient`` keeps no cookie at all (:func:`no_cookies`): a
cookie set on one session's answer must never reach another session's requests. The
first request of a session is sent alone (a lock), so two calls starting together in
one session cannot reach two replicas.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

Saved = list[tuple[str, str, str, str]]
"""A jar as plain data (name, value, domain, path), to keep a session's replica."""


def no_cookies() -> http.cookiejar.CookieJar:
    """A jar that refuses every cookie, for the Space's shared client (given as a
    ``CookieJar``: httpx copies an ``httpx.Cookies`` into a default jar)."""
    policy = http.cookiejar.DefaultCookiePolicy(allowed_domains=[])
    return http.cookiejar.CookieJar(policy)


class Affinity:
    """The cookies of one upstream session (or of a Space's own requests)."""

    def __init__(self, saved: Iterable[tuple[str, str, str, str]] = ()) -> None:
        self.jar = httpx.Cookies()
        for name, value, domain, path in saved:
            self.jar.set(name, value, domain=domain, path=path)
        self._first = asyncio.Lock()
        self.pinned = bool(self.jar)

    def headers(
        self, url: str | httpx.URL, extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """``extra`` plus the ``cookie`` header this jar sends to ``url``."""
        out = dict(extra or {})
        if not self.jar:
            return out
        probe = httpx.Request("GET", url)
        self.jar.set_cookie_header(probe)
        if "cookie" in probe.headers:
            out["cookie"] = probe.headers["cookie"]
        return out

    def keep(self, response: httpx.Response) -> None:
        """The cookies ``response`` set (the replica it came from)."""
        self.jar.extract_cookies(response)
        self.pinned = True

    async def send(
        self, http: httpx.AsyncClient, method: str, url: str | httpx.URL,
        headers: Mapping[str, str] | None = None, **kwargs: Any,
    ) -> httpx.Response:  # fmt: skip
        """One request with this jar's cookies; its answer's cookies kept. Until the
        first answer came back, requests go one at a time (one replica per session)."""
        if self.pinned:
            return await self._send(http, method, url, headers, kwargs)
        async with self._first:
            return await self._send(http, method, url, headers, kwargs)

    async def _send(
        self, http: httpx.AsyncClient, method: str, url: str | httpx.URL,
        headers: Mapping[str, str] | None, kwargs: dict[str, Any],
    ) -> httpx.Response:  # fmt: skip
        response = await http.request(method, url, headers=self.headers(url, headers), **kwargs)
        self.keep(response)
        return response

    def saved(self) -> Saved:
        """The jar as plain data (:class:`Affinity` takes it back)."""
        return [(c.name, c.value or "", c.domain, c.path) for c in self.jar.jar]
