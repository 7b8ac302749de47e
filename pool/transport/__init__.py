"""The transport layer: how a pooled connection talks to a Space, behind one interface.

:class:`SpaceClient` / :class:`SpaceCall` / :class:`SpaceOpener` (:mod:`._interface`)
are all the layers above see. Two transports implement them: the native one
(:mod:`._native` on the wire protocol below) and the fallback (:mod:`._fallback`, a
``gradio_client.Client`` per connection). Nothing above this package imports
``gradio_client`` or asks which transport it holds.

The Gradio wire protocol, asyncio-native: no thread, no poll, one HTTP client a Space.

What it speaks (the facts and their Gradio sources are in ``docs/gradio-protocol.md``
and in each module's docstring): the queue protocol of Gradio 4 to 6 —
``sse_v3`` (today's servers), and ``sse_v2.1``, ``sse_v2``, ``sse_v1``, which differ from it
only in whether partial outputs are diffs and in when the server ends the data stream:

* ``GET config`` and ``GET gradio_api/info?serialize=False``, once per Space and
  ``app_id`` (:class:`SpaceTransport.load`; a new connection costs one ``app_id``
  request to find out whether the Space restarted);
* per lease a :class:`Session` (a fresh ``session_hash``, so no ``gr.State`` crosses
  users; or one given, to keep state on purpose) with its own replica cookies
  (:class:`Affinity`): ``queue/join``, one reader of the
  session's ``queue/data`` stream dispatching each message to its :class:`Call` the
  moment it arrives, ``cancel``, the ``heartbeat`` stream where a call needs it;
* ``upload`` of input files and the download of output files (retried once when a
  kept-alive connection turns out closed; a body shorter than the announced ``size``
  is an error).

Every request a call makes carries that call's headers and no other call's. Every
message becomes a typed event (:mod:`._events`). Everything runs on one
``httpx.AsyncClient`` per Space (``httpx-sse`` parses the streams).

The data layer stays gradio_client's (``handle_file``, ``FileData``, argument binding,
diffs, ``view_api``'s dict). This package knows nothing of admission or pooling.

What it does not speak: the ``ws`` and ``sse`` (v0) protocols of Gradio 3 —
:class:`ProtocolNotSupported` — for which the pool falls back to a
``gradio_client.Client`` (:mod:`._fallback`), as it does with ``POOL_TRANSPORT=gradio_client``.
"""

from __future__ import annotations

from ._affinity import Affinity
from ._app import NATIVE_PROTOCOLS, AppInfo, Endpoint, ProtocolNotSupported, apply_diff
from ._errors import Classified, classify, classify_connect
from ._events import (
    ProgressUnit,
    UpstreamDone,
    UpstreamEvent,
    UpstreamLog,
    UpstreamPartial,
    UpstreamProgress,
    UpstreamQueued,
    UpstreamStarted,
)
from ._fallback import FallbackClient, FallbackOpener, GradioFactory, quiet_gradio_env
from ._feed import Feed
from ._files import (
    Downloaded,
    Redirected,
    SpaceFile,
    TooLarge,
    download_to,
    file_arg,
    file_url,
    is_url,
    safe_name,
    space_files_in,
)
from ._interface import Relay, Replica, SpaceCall, SpaceClient, SpaceOpener
from ._native import NativeClient, NativeOpener
from ._queue import EVENTS_KEEP, Call, CallCancelled, Session, SessionDropped
from ._space import RateLimited, ShortBody, SpaceTransport

__all__ = [
    "EVENTS_KEEP",
    "NATIVE_PROTOCOLS",
    "Affinity",
    "AppInfo",
    "Call",
    "CallCancelled",
    "Classified",
    "Downloaded",
    "Endpoint",
    "FallbackClient",
    "FallbackOpener",
    "Feed",
    "GradioFactory",
    "NativeClient",
    "NativeOpener",
    "ProgressUnit",
    "ProtocolNotSupported",
    "RateLimited",
    "Redirected",
    "Relay",
    "Replica",
    "Session",
    "SessionDropped",
    "ShortBody",
    "SpaceCall",
    "SpaceClient",
    "SpaceFile",
    "SpaceOpener",
    "SpaceTransport",
    "TooLarge",
    "UpstreamDone",
    "UpstreamEvent",
    "UpstreamLog",
    "UpstreamPartial",
    "UpstreamProgress",
    "UpstreamQueued",
    "UpstreamStarted",
    "apply_diff",
    "classify",
    "classify_connect",
    "download_to",
    "file_arg",
    "file_url",
    "is_url",
    "quiet_gradio_env",
    "safe_name",
    "space_files_in",
]
