"""A cookie-routing front for a replicated stand-in Space (an ASGI app; no gradio).

A Space with several replicas is served by the Hub behind one address; a client keeps
the cookie its first answer set (gradio_client keeps ``/config``'s cookies) and the
Hub routes every later request carrying it to the same replica. Without it, a
session's queue join and its data stream could land on different replicas, and the
session (``gr.State``, the event itself) would be lost.

:func:`cookie_front` does that for ``backends``: a request without the cookie goes to
the next replica in turn and its answer sets ``spacepool-replica=<n>``; a request with
it goes to replica ``n``. Bodies are streamed both ways (the server-sent events too).
Paths in ``app.loose`` (a set the test fills) ignore the cookie and go to the next
replica in turn: a request the Hub routes to another replica than its cookie names.
``await app.aclose()`` closes its connections to the replicas once it is no longer served.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from http.cookies import SimpleCookie
from typing import Any

import httpx

COOKIE = "spacepool-replica"
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]
_HOP = frozenset({b"host", b"connection", b"keep-alive", b"transfer-encoding", b"cookie"})


def cookie_front(backends: Sequence[str]) -> ASGIApp:
    """The front's ASGI app over ``backends`` (base URLs); ``app.routed`` counts requests
    per replica, ``app.loose`` holds the paths routed without regard to the cookie,
    ``app.aclose()`` closes the client that reaches the replicas."""
    turn = itertools.cycle(range(len(backends)))
    http = httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None))
    routed = [0] * len(backends)
    loose: set[str] = set()

    async def app(scope: Scope, receive: Callable[[], Awaitable[Message]],
                  send: Callable[[Message], Awaitable[None]]) -> None:  # fmt: skip
        if scope["type"] != "http":
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        cookies = SimpleCookie(dict(scope["headers"]).get(b"cookie", b"").decode())
        known = cookies.get(COOKIE)
        if known is not None and scope["path"] not in loose:
            replica = int(known.value)
        else:
            replica = next(turn)
        routed[replica] += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        url = backends[replica].rstrip("/") + scope["path"]
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode()
        request = http.build_request(scope["method"], url, headers=headers, content=body)
        response = await http.send(request, stream=True)
        try:
            out = [(k.encode(), v.encode()) for k, v in response.headers.multi_items()
                   if k.encode() not in _HOP and k != "content-length"]  # fmt: skip
            if known is None:
                out.append((b"set-cookie", f"{COOKIE}={replica}; Path=/".encode()))
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": out})  # fmt: skip
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    app.routed = routed  # type: ignore[attr-defined]
    app.loose = loose  # type: ignore[attr-defined]
    app.aclose = http.aclose  # type: ignore[attr-defined]
    return app
