"""What every transport gives a pooled connection: :class:`SpaceClient`, :class:`SpaceCall`,
and :class:`SpaceOpener` that makes clients.

The layers above (``pool/connections``, routing, the request path, the service) hold
these and nothing else: they never look behind them, never import ``gradio_client`` and
never ask which transport they hold. Two transports implement them:

* the native one (:mod:`._native`): the Gradio queue protocol on the event loop,
  one :class:`~pool.transport.Session` per lease;
* the fallback (:mod:`._fallback`): a ``gradio_client.Client`` per connection, for the
  protocols the native transport does not speak (Gradio 3's ``ws`` and ``sse``) and
  for ``POOL_TRANSPORT=gradio_client``.

Where a transport cannot do something, the method says so the same way for every
caller (:class:`~pool.transport.ProtocolNotSupported` from :meth:`SpaceClient.wire`),
never by its type.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import httpx

    from ._app import AppInfo
    from ._feed import Feed
    from ._files import Downloaded
    from ._space import SpaceTransport

Replica = tuple[tuple[str, str, str, str], ...]
"""The cookies that bring requests back to one replica of a Space (``Affinity.saved()``)."""
Relay = Callable[[dict[str, Any]], None]
"""Gets every raw queue message of one relayed event (:meth:`SpaceClient.join_raw`)."""


class SpaceCall(Protocol):
    """One job placed on a Space."""

    @property
    def result(self) -> asyncio.Future[Any]:
        """The job's final output (or its error)."""

    @property
    def outputs(self) -> Feed:
        """Its outputs as they come (the latest ``keep``)."""

    @property
    def events(self) -> Feed:
        """Every message about it as a typed :class:`~pool.transport.UpstreamEvent`."""

    @property
    def done(self) -> bool: ...

    @property
    def named(self) -> bool:
        """Whether the Space has named the job (its event id is known)."""

    @property
    def congested(self) -> bool:
        """Whether the job waited for a worker in the Space's own queue."""

    @property
    def prompt(self) -> bool:
        """Whether the Space had a worker free for the job when it joined."""

    @property
    def started_at(self) -> float | None:
        """When its ``process_starts`` reached us (``time.monotonic()``), if seen."""

    @property
    def queue_rank(self) -> int | None:
        """Its rank in the Space's queue before it started (0 = next), if seen."""

    @property
    def queue_size(self) -> int | None: ...

    @property
    def cancel_settled(self) -> bool:
        """Whether a cancel needs no further attempt (confirmed, or the job ended)."""

    @property
    def reachable(self) -> bool:
        """Whether another cancel attempt can still be posted (the client is open)."""

    async def cancel(self) -> None:
        """The first cancel: marks the job cancelled and posts it once."""

    async def send_cancel(self) -> None:
        """Post the cancel again (after a failed attempt)."""

    def status(self) -> Any:
        """gradio_client's status update (the fallback's; the native transport raises
        :class:`NotImplementedError`: its events say more)."""


class SpaceClient(Protocol):
    """One pooled connection's client of a Space."""

    @property
    def app_id(self) -> object:
        """The Space's ``app_id`` when this client opened (changes on a restart)."""

    @property
    def root(self) -> str:
        """The Space's URL, prefixed by its API root (``…/gradio_api`` on Gradio 5+)."""

    cancel_wait_s: float
    """How long closing waits at most for this client's job cancels to reach the Space."""

    def api_names(self) -> list[str]:
        """The Space's public ``api_name`` values, with the leading slash."""

    def is_generator(self, api_name: str | None) -> bool:
        """Whether ``api_name`` streams partial outputs (True when the Space's config
        does not say)."""

    def view_api(self) -> dict[str, Any]:
        """``Client.view_api(return_format="dict")``'s dict (no network)."""

    def submit(
        self, api_name: str | None, args: tuple[Any, ...], kwargs: Mapping[str, Any],
        headers: Mapping[str, str] | None, keep: int,
    ) -> SpaceCall:  # fmt: skip
        """Start a job (ValueError/TypeError for arguments the endpoint refuses)."""

    def probe_headers(self) -> dict[str, str]:
        """The cookies that keep a probe of ``root/app_id`` on this client's replica."""

    async def download(
        self, data: dict[str, Any], directory: str | os.PathLike[str], *, max_bytes: int,
        headers: Mapping[str, str] | None, http: httpx.AsyncClient | None,
    ) -> Downloaded:  # fmt: skip
        """Fetch one output FileData into ``directory`` (``http``: the pool's client,
        for a transport without its own)."""

    def use_session(self, session_hash: str, replica: Replica) -> None:
        """Continue a known upstream session (its ``gr.State``) on this client, on the
        replica ``replica``'s cookies reach. Leases continuing one session at once share
        its data stream and heartbeat (a Gradio session has one of each)."""

    async def join_raw(
        self, fn_index: int, data: list[Any], relay: Relay, fields: Mapping[str, Any]
    ) -> SpaceCall:
        """Join one event of ``fn_index`` with ``data`` as a Gradio client sent it (a
        relay: no argument binding) in the lease's session, ``fields`` the rest of its
        join body (``event_data``, ``trigger_id``, ...); returned once the Space
        named it, ``relay`` getting each of its raw messages. The join's own errors are
        raised here; :class:`~pool.transport.ProtocolNotSupported` where the transport
        cannot relay the raw protocol (the fallback)."""

    async def replica_app_id(self, replica: Replica | None) -> tuple[object, Replica] | None:
        """The ``app_id`` the replica ``replica`` reaches answers now, with the cookies
        that reach it again (None: the home replica's; the result None: not answering)."""

    def reset_session(self) -> None:
        """Retire the lease's upstream session: the next lease starts a fresh one."""

    def settled(self) -> bool:
        """Whether the last lease's result stream is closed (the client may serve
        another lease now)."""

    async def settle(self) -> bool:
        """Wait (bounded) for the last lease's result stream to close; False if it did
        not, and the client must not serve another lease."""

    def stop_streams(self) -> None:
        """Close the lease's data stream and heartbeat now (a fenced lease)."""

    def wire(self) -> tuple[SpaceTransport, AppInfo]:
        """The Space's native transport and app, for a relay of the raw protocol (the
        Gradio front); :class:`~pool.transport.ProtocolNotSupported` where there is none."""

    async def aclose(self) -> None:
        """Free everything the client holds (sessions, tasks, threads, sockets)."""


class SpaceOpener(Protocol):
    """Opens :class:`SpaceClient` objects for a Space's source (a URL or a Hub id)."""

    async def open(self, src: str) -> SpaceClient: ...

    def cut_opening(self) -> None:
        """Fail every client being opened at once, and refuse new ones (closing)."""

    async def aclose(self) -> None:
        """Free what the opener shares between its clients (HTTP clients, threads)."""
