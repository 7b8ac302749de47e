"""The HTTP/1.1 protocol the service is served with: uvicorn's httptools one, headers bounded.

httptools (llhttp) accepts a request head of any size: it gathers a header's pieces
until the line ends, so one 32 MiB header is 32 MiB (and more) of memory, taken before
any route, any auth, any limit of the app runs (issue 38, F4). This protocol feeds the
parser at most :data:`HEAD_MAX_BYTES` of a request before its head is complete: past
that the answer is 431 and the connection is closed, whatever the parser holds. A
request line or one header longer than :data:`LINE_MAX_BYTES` is a 431 as well. The
rest — bodies, pipelining, upgrades, flow control — is uvicorn's, unchanged.

Every way the project starts the service uses it (``python -m app``, ``scripts/run``,
the Dockerfile's ``--http app._http:BoundedHttpToolsProtocol``); uvicorn picks its
protocol before it imports the app, so a bare ``uvicorn app.main:app`` must be given
that ``--http`` too (the README says so). uvicorn's h11 protocol (``--http h11``) has a
bound of its own: the whole head at most 16 KiB (``--h11-max-incomplete-event-size``).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEAD_MAX_BYTES = 64 * 1024
"""A request's head (request line and every header) at most: past it, 431."""
LINE_MAX_BYTES = 16 * 1024
"""The request line, or one header (name and value), at most: past it, 431."""
PROTOCOL = "app._http:BoundedHttpToolsProtocol"
"""What uvicorn's ``http`` setting (``--http``) names for this protocol."""

_TOO_LARGE = b"request header fields too large"


class _HeadTooLarge(Exception):
    """Raised from a parser callback: the parser stops (httptools raises an
    ``HttpParserCallbackError``, uvicorn answers through :meth:`send_400_response`)."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the request head bounded (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the parser is inside a request's head
        self._head_bytes = 0  # bytes of that head fed to the parser so far
        self._refused = False
        self._line_too_long = False  # a callback refused a line: answered 431, not 400

    def data_received(self, data: bytes) -> None:
        while data and self._in_head and not self._refused:
            room = HEAD_MAX_BYTES - self._head_bytes
            if room <= 0:
                self._refuse()
                return
            part, data = data[:room], data[room:]
            self._head_bytes += len(part)
            self._feed(part)
        if data and not self._refused:
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        super().data_received(data)  # a callback's _HeadTooLarge: send_400_response
        if self._line_too_long:
            self._refuse()

    def _refuse(self) -> None:
        if self._refused:
            return
        self._refused = True
        if self.transport.is_closing():
            return
        head = (
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: text/plain; charset=utf-8\r\n"
            b"content-length: " + str(len(_TOO_LARGE)).encode() + b"\r\n"
            b"connection: close\r\n\r\n"
        )
        self.transport.write(head + _TOO_LARGE)
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        if self._line_too_long:  # the parser stopped at a callback's refusal: a 431
            self._refuse()
            return
        super().send_400_response(msg)

    # -- parser callbacks ----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._in_head = True
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        if len(self.url) + len(url) > LINE_MAX_BYTES:
            self._line_too_long = True
            raise _HeadTooLarge
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) > LINE_MAX_BYTES:
            self._line_too_long = True
            raise _HeadTooLarge
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head = True  # the next request's head, if one comes on this connection
        self._head_bytes = 0
        super().on_message_complete()
