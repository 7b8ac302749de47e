"""A session on a Space's queue, and the calls made in it.

The queue protocol (``sse_v1``…``sse_v3``; gradio/routes.py ``queue_join``,
``queue_data``, ``cancel_event``, ``heartbeat``; gradio_client client.py ``send_data``,
``stream_messages``; client/js/src/utils/submit.ts):

* ``POST queue/join`` ``{data, fn_index, session_hash, event_data, trigger_id}`` (and
  the rest of gradio/data_classes.py ``PredictBody``) → ``{event_id}``; 503 when the
  queue is full, 422 when a validator refuses the input.
* ``GET queue/data?session_hash=`` is ONE server-sent-event stream per session carrying
  every event of it, tagged by ``event_id``. The server ends it with ``close_stream``
  once the session has no pending event (its queue stays: a later stream picks up
  where this one stopped); if it is cut, the server drops every event of the session.
* ``POST cancel`` ``{session_hash, fn_index, event_id}``: the server completes the
  event with an empty output.
* ``GET heartbeat/{session_hash}`` (only when the config asks, ``connect_heartbeat``):
  while it is open the session's state is kept; when it ends, unload handlers run.
  Opened by the first call that needs it (``Endpoint.needs_heartbeat``: it touches a
  ``gr.State`` or is a ``stream`` event, or the app has ``unload`` listeners), so a
  session of stateless calls costs no held connection (and no new one per lease).

Here one reader task per session reads the stream and hands each message to its call
at once (``Call._on_message``: no polling, no thread). A message for an event whose
join has not returned yet is kept until the call registers. Every request of a call —
upload, join, cancel, and the data stream and heartbeat it opens — carries that call's
headers, and no other call's, and the session's replica cookies (:mod:`._affinity`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

import httpx
from gradio_client import utils
from gradio_client.exceptions import AppError, ValidationError
from httpx_sse import aconnect_sse

from .._tasks import cancel_and_wait  # a generic asyncio helper, nothing of admission
from .._trace import CallSpans
from ._affinity import Affinity
from ._app import DIFF_PROTOCOLS, AppInfo, Endpoint, bind_args, shape_output
from ._events import (
    UpstreamDone,
    UpstreamEvent,
    UpstreamPartial,
    UpstreamQueued,
    UpstreamStarted,
    status_event,
)
from ._feed import Feed
from ._files import SpaceFile
from ._interface import Relay
from ._space import SpaceTransport

EVENTS_KEEP = 256  # events kept per call for a reader that falls behind
_READER_END_S = 0.5  # closing: how long an idle reader may take to see its stream end


class SessionDropped(Exception):
    """The session's data stream ended while the call ran: the Space dropped the call
    (restarted, killed, or the stream was cut)."""


class CallCancelled(Exception):
    """The call was cancelled (:meth:`Call.cancel`)."""


class Session:
    """One ``session_hash`` on one Space: its data-stream reader and its calls."""

    def __init__(
        self, space: SpaceTransport, app: AppInfo, session_hash: str | None = None,
        affinity: Affinity | None = None,
    ) -> None:  # fmt: skip
        self.space = space
        self.app = app
        self.hash = session_hash or uuid.uuid4().hex
        # This session's replica cookies (:mod:`._affinity`): every request below.
        self.affinity = affinity or Affinity()
        self._calls: dict[str, Call] = {}  # joined, not finished: event_id → call
        self._early: dict[str, list[dict[str, Any]]] = {}  # messages before the join returned
        self._all: set[Call] = set()
        self._reader: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self.closed = False

    def submit(
        self,
        api_name: str | None,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        headers: Mapping[str, str] | None = None,
        keep: int = 32,
    ) -> Call:
        """Start a call (upload, join, then its messages) and return it at once.

        ValueError for an unknown endpoint, TypeError for arguments that do not bind
        (as gradio_client raises them); every other failure ends the call."""
        if self.closed:
            raise RuntimeError("session closed")
        endpoint = self.app.endpoint(api_name)
        data = bind_args(endpoint, args, dict(kwargs))
        call = Call(self, endpoint, data, dict(headers or {}), keep)
        self._all.add(call)
        call._task = asyncio.get_running_loop().create_task(call._run())
        call._task.add_done_callback(lambda _: self._all.discard(call))
        return call

    async def join_data(
        self,
        fn_index: int,
        data: list[Any],
        *,
        headers: Mapping[str, str] | None = None,
        relay: Relay | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> Call:
        """Join a call of ``fn_index`` with its wire ``data`` as a client sent it (a
        relay: no argument binding; local files among it uploaded first) and return it
        once the Space named it. ``relay(msg)`` gets each raw message of the call as it
        arrives; ``fields``: the rest of the client's join body (``event_data``,
        ``trigger_id``, ...), sent as they are. The join's errors (503 ``QueueError``,
        ``ValidationError``, httpx's) are raised here; KeyError for an unknown
        ``fn_index``."""
        if self.closed:
            raise RuntimeError("session closed")
        call = Call(self, self.app.endpoints[fn_index], list(data), dict(headers or {}), 1)
        call.relay = relay
        call.fields = dict(fields or {})
        self._all.add(call)
        call.result.add_done_callback(lambda _: self._all.discard(call))
        try:
            with call.spans.upload():
                sent = await call._upload(call._data)
            call.event_id = await self._join(call, sent)
            call.spans.joined()
        except BaseException as exc:
            call._fail(exc if isinstance(exc, Exception) else SessionDropped("cancelled"))
            raise
        self._register(call)
        return call

    # -- wire requests -------------------------------------------------------------------
    async def _join(self, call: Call, data: list[Any]) -> str:
        body = {"event_data": None, "trigger_id": None, **call.fields, "data": data,
                "fn_index": call.endpoint.fn_index, "session_hash": self.hash}  # fmt: skip
        # gradio_client sends x-gradio-user: api on joins; the call's headers win.
        headers = {"x-gradio-user": "api", **call.headers}
        response = await self.affinity.send(self.space.http, "POST",
                                            self.app.url(utils.SSE_DATA_URL), headers,
                                            json=body)  # fmt: skip
        if response.status_code == 503:
            raise utils.QueueError("Queue is full! Please try again.")
        if response.status_code == 429:  # the Hub's rate limit, in front of the Space
            raise self.space.rate_limited(response)
        if response.status_code == 422:
            await response.aread()
            if (message := utils.extract_validation_message(response)) is not None:
                raise ValidationError(message)
        response.raise_for_status()
        return str(response.json()["event_id"])

    async def _cancel(self, call: Call) -> None:
        body = {"session_hash": self.hash, "fn_index": call.endpoint.fn_index,
                "event_id": call.event_id}  # fmt: skip
        response = await self.affinity.send(self.space.http, "POST",
                                            self.app.url(utils.CANCEL_URL), call.headers,
                                            json=body)  # fmt: skip
        response.raise_for_status()

    # -- the data stream ---------------------------------------------------------------
    def _register(self, call: Call) -> None:
        """The join returned: route the call's messages to it (those already read
        first) and make sure a reader runs."""
        assert call.event_id is not None
        self._calls[call.event_id] = call
        for msg in self._early.pop(call.event_id, []):
            self._dispatch(msg)
        if call.event_id in self._calls and (self._reader is None or self._reader.done()):
            self._reader = asyncio.get_running_loop().create_task(self._read(call.headers))
        if call.endpoint.needs_heartbeat and self._heartbeat is None:
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat(call.headers))

    def _dispatch(self, msg: dict[str, Any]) -> None:
        event_id = msg.get("event_id")
        if not isinstance(event_id, str):
            if msg.get("msg") in ("unexpected_error", "server_stopped"):
                self._drop_all(SessionDropped(str(msg.get("message") or "server stopped")))
            return
        call = self._calls.get(event_id)
        if call is None:
            self._early.setdefault(event_id, []).append(msg)
            return
        if call._on_message(msg):
            del self._calls[event_id]

    async def _read(self, headers: Mapping[str, str]) -> None:
        """Read the session's stream until no call is pending; reopen it when the
        server closed it as a call was joining; a cut stream drops every call."""
        url = self.app.url(utils.SSE_URL)
        timeout = httpx.Timeout(self.space.timeout.connect, read=self.space.timeout.read)
        try:
            while self._calls:
                ended = False
                async with aconnect_sse(self.space.http, "GET", url,
                                        headers=self.affinity.headers(url, headers),
                                        params={"session_hash": self.hash},
                                        timeout=timeout) as source:  # fmt: skip
                    source.response.raise_for_status()
                    beat = self.space.cadence.stream()
                    async for sse in source.aiter_sse():
                        if not sse.data:
                            continue
                        msg = json.loads(sse.data)
                        kind = msg.get("msg")
                        if kind == "heartbeat":
                            beat()
                            continue
                        if kind == "close_stream":
                            ended = True  # the server ends the body next: read to its
                            continue  # end, so that the connection stays alive for reuse
                        self._dispatch(msg)
                if not ended:
                    raise SessionDropped("the Space closed the session's stream")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not isinstance(exc, SessionDropped):
                exc = SessionDropped(f"the session's stream failed ({type(exc).__name__})")
            self._drop_all(exc)

    async def _beat(self, headers: Mapping[str, str]) -> None:
        """Hold the session's heartbeat stream open until the session closes."""
        url = self.app.url(utils.HEARTBEAT_URL.format(session_hash=self.hash))
        timeout = httpx.Timeout(self.space.timeout.connect, read=None)
        with contextlib.suppress(httpx.HTTPError):
            async with self.space.http.stream("GET", url,
                                              headers=self.affinity.headers(url, headers),
                                              timeout=timeout) as response:  # fmt: skip
                beat = self.space.cadence.stream()
                async for _ in response.aiter_bytes():
                    beat()

    def stop_streams(self) -> None:
        """Cut the data stream and the heartbeat now; the calls' own tasks (joins,
        and the cancels they post after a join) go on. The Space drops the session's
        events when it sees the stream end (gradio/routes.py ``queue_data``)."""
        for task in (self._reader, self._heartbeat):
            if task is not None:
                task.cancel()

    def _drop_all(self, error: Exception) -> None:
        calls, self._calls = list(self._calls.values()), {}
        for call in calls:
            call._fail(error)

    async def aclose(self) -> None:
        """End the reader, the heartbeat and every call still joining; calls still
        pending fail with :class:`SessionDropped`."""
        self.closed = True
        reader = self._reader
        if reader is not None and not reader.done() and not self._calls:
            # Nothing pending: the server is ending the stream; let it, so that its
            # connection goes back to the pool instead of being cut.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reader), _READER_END_S)
        tasks = [t for t in (self._reader, self._heartbeat) if t is not None]
        tasks += [c._task for c in self._all if c._task is not None]
        await cancel_and_wait(*tasks)
        self._drop_all(SessionDropped("the session was closed"))
        for call in list(self._all):
            call._fail(SessionDropped("the session was closed"))
        self._early.clear()


_WAITED = 0.1  # of a run: a predicted wait for a worker above it is a wait in the queue
_SEEN_WAIT_MIN_S = 0.15  # a start seen later than this (and _WAITED) after the estimation:
# the Space's dispatch (a poll of 1–10 ms) on a loaded host takes tens of ms
_OVERRULE_MIN_S = 0.5  # a start seen this late overrules the Space's "a worker is free":
# a starved host (ours or the Space's, load 10+ on 2 cores) delays a dispatch or our read
# of it by a few hundred ms; read as waits they hold a window far below the Space's limit
# (suspected when 80 calls on a Space of 64 opened only 13 connections under the suite)


class Call:
    """One call in a session: its result, its outputs and its events as they come."""

    def __init__(
        self, session: Session, endpoint: Endpoint, data: list[Any], headers: dict[str, str],
        keep: int,
    ) -> None:  # fmt: skip
        self.session = session
        self.endpoint = endpoint
        self.spans = CallSpans(endpoint.api_name)  # pool/_trace.py; traceparent upstream
        self.headers = {**self.spans.headers(), **headers}
        self._data = data
        self.event_id: str | None = None
        self.result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.result.add_done_callback(_retrieve)
        self.result.add_done_callback(self.spans.ended)
        self.outputs = Feed(keep)
        self.events = Feed(EVENTS_KEEP)
        self._diffed: list[Any] | None = None
        self.relay: Relay | None = None  # every raw message, for a relay (join_data)
        self.fields: dict[str, Any] = {}  # the rest of a relayed join's body (join_data)
        self._cancel_requested = False
        # The Space's own queue as this call saw it before it started (``estimation``:
        # every joined event gets one, rank 0 = next, even one that starts at once;
        # gradio/queueing.py ``broadcast_estimations``): the highest rank and its size.
        self.queue_rank: int | None = None
        self.queue_size: int | None = None
        # What the Space itself said this call would wait for a worker, in its last
        # ``estimation`` before ``process_starts``: that message's ``rank_eta`` is the
        # function's average run time + ``wait_so_far`` (the events ahead of it, each
        # counted avg / concurrency_limit, whether or not a worker is free) + the time
        # until a worker frees (> 0 only while every worker is busy: ``current_concurrency
        # == concurrency_limit``); ``process_starts`` then carries that average run time
        # as ``eta``. With Gradio's default live updates the Space sends every waiting
        # event a new estimation after each dispatch (``start_processing`` calls
        # ``broadcast_estimations``), so an event's last one before it starts has rank 0
        # and the difference is the Space's own "every worker was busy" — free of our
        # clock and of the rank a burst of joins gets with workers free (the first
        # estimation of the second of two joins in one poll says rank 1, a wait of
        # avg / limit, though a worker is free for it: read as a wait, it brought the
        # window of a Space that runs 4 down to 1). All in gradio/queueing.py
        # (``push``, ``start_processing``, ``broadcast_estimations``,
        # ``process_events``). None when the last estimation had rank > 0 (a Space
        # with periodic status updates) or carried no ETA.
        self.queue_wait_s: float | None = None
        self.run_eta_s: float | None = None
        self._last_rank: int | None = None
        self._last_eta_s: float | None = None
        # And what it waited as seen here: from its last ``estimation`` to
        # ``process_starts``, two messages of one stream (our loop's delays hit both);
        # the Space's own estimate misses a wait behind events that overran their
        # average (it counts a worker free from its expected end on).
        self._queued_at: float | None = None
        self.seen_wait_s: float | None = None
        # When its ``process_starts`` reached us (monotonic): how many of our calls ran
        # at the Space at once is counted from these messages (connections/_pacing.py).
        self.started_at: float | None = None
        self.started = False
        self.cancel_confirmed = False  # the Space answered a cancel of it (2xx)
        self.ended = False  # the Space sent its last message (it runs no more)
        self._task: asyncio.Task[None] | None = None

    @property
    def done(self) -> bool:
        return self.result.done()

    @property
    def named(self) -> bool:
        """Whether the Space has named the call (its join returned an event id)."""
        return self.event_id is not None

    async def _run(self) -> None:
        try:
            with self.spans.upload():
                data = await self._upload(self._data)
            if self._cancel_requested:
                raise CallCancelled("cancelled before it was sent")
            self.event_id = await self.session._join(self, data)
            self.spans.joined()
            self.session._register(self)
            if self._cancel_requested:  # cancelled while joining: now it has a name
                await self.send_cancel()
        except asyncio.CancelledError:
            self._fail(SessionDropped("the session was closed"))
            raise
        except Exception as exc:
            self._fail(exc)

    async def _upload(self, data: list[Any]) -> list[Any]:
        """Local files among the inputs uploaded, their FileData pointing at the Space's
        copy (gradio_client client.py ``Endpoint._upload_file``); URLs and
        :class:`SpaceFile` (a file on the Space, named by an untrusted caller) left as
        they are: nothing but a trusted caller's own file is read from this host."""
        found: list[dict[str, Any]] = []
        utils.traverse(data, found.append, utils.is_file_obj_with_meta)
        uploaded: dict[int, str] = {}
        for item in found:
            path = item["path"]
            if isinstance(item, SpaceFile):  # on the Space already: sent as it is
                continue
            if not utils.is_http_url_like(path) and id(item) not in uploaded:
                # Under the name the caller gave (file_arg(..., name=)): the app sees it.
                uploaded[id(item)] = await self.session.space.upload(
                    path, self.headers, self.session.app.max_file_size, item.get("orig_name"),
                    self.session.affinity,
                )
        if not uploaded:
            return data

        def replace(item: dict[str, Any]) -> dict[str, Any]:
            if id(item) not in uploaded:
                return item
            name = utils.strip_invalid_filename_characters(
                str(item.get("orig_name") or item["path"]).replace("\\", "/").rsplit("/", 1)[-1]
            )
            return {"path": uploaded[id(item)], "orig_name": name,
                    "meta": {"_type": "gradio.FileData"}}  # fmt: skip

        return list(utils.traverse(data, replace, utils.is_file_obj_with_meta))

    async def cancel(self) -> None:
        """Cancel the call on the Space (``POST cancel``; for a call still joining, as
        soon as the join returns: a Space must not run it unwatched); its result
        raises :class:`CallCancelled` from now on. Returns once the cancel is sent."""
        if self.done:
            return
        self._cancel_requested = True
        self._fail(CallCancelled("the call was cancelled"))
        await self.send_cancel()

    async def send_cancel(self) -> None:
        """One ``POST cancel`` of a cancelled call (raises when it is not confirmed);
        for a call still joining, waits for the join (``_run`` posts it after). Safe to
        repeat: the Space answers a cancel of an event it no longer runs all the same
        (gradio/routes.py ``cancel_event``). :mod:`pool.connections._cancels` repeats it until
        :attr:`cancel_settled`."""
        if self.event_id is not None:
            await self.session._cancel(self)
            self.cancel_confirmed = True
        elif self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    @property
    def cancel_settled(self) -> bool:
        """Nothing of this call can still run at the Space: its cancel was confirmed,
        the Space ended it, or it was never joined (and will not be)."""
        joining = self._task is not None and not self._task.done()
        return self.cancel_confirmed or self.ended or (self.event_id is None and not joining)

    @property
    def reachable(self) -> bool:
        """Whether another cancel can be posted: the Space's HTTP client is open."""
        return not self.session.space.http.is_closed

    def status(self) -> Any:
        raise NotImplementedError("status() is the fallback transport's; use the events")

    def _on_message(self, msg: dict[str, Any]) -> bool:
        """Handle one message of this call; True when it was the last."""
        if self.relay is not None:
            self.relay(msg)
        kind = msg.get("msg")
        event = status_event(msg)
        if event is not None:
            self._note_queue(event)
            self._event(event)
            return False
        if kind in ("process_generating", "process_streaming"):
            output = msg.get("output") or {}
            if msg.get("success", True) and isinstance(output.get("data"), list):
                data = self._apply_diff(kind, list(output["data"]))
                value = shape_output(self.endpoint, data)
                self._event(UpstreamPartial(self.outputs.total, value))
                self.outputs.append(value)
            return False
        if kind == "process_completed":
            self.ended = True
            self._complete(msg)
            return True
        if kind in ("unexpected_error", "server_stopped"):
            self.ended = True
            self._fail(SessionDropped(str(msg.get("message") or kind)))
            return True
        return False

    def _note_queue(self, event: UpstreamEvent) -> None:
        if isinstance(event, UpstreamStarted):
            now = time.monotonic()
            self.started = True
            self.started_at = now
            self.spans.started()
            self.run_eta_s = event.eta_s
            if event.eta_s is not None and self._last_eta_s is not None and self._last_rank == 0:
                self.queue_wait_s = max(0.0, self._last_eta_s - event.eta_s)
            if self._queued_at is not None:
                self.seen_wait_s = now - self._queued_at
        elif isinstance(event, UpstreamQueued) and not self.started and event.rank is not None:
            self._last_rank, self._last_eta_s = event.rank, event.eta_s
            self._queued_at = time.monotonic()
            if self.queue_rank is None or event.rank >= self.queue_rank:
                self.queue_rank, self.queue_size = event.rank, event.queue_size

    @property
    def congested(self) -> bool:
        """The call waited for a worker over a tenth of a run: the Space's last
        estimation before its start said every worker was busy (see ``queue_wait_s``);
        or, where it said nothing of it, its start came that long after that estimation
        (as seen here). Where it said a worker was free, only a start half a run late
        counts (a wait behind an event that overran its average, which the Space counts
        free from its expected end): a Space starved of CPU dispatches late with
        workers free, and our loop may read two messages of one stream far apart."""
        run, said, seen = self.run_eta_s, self.queue_wait_s, self.seen_wait_s
        if run is None:
            return False
        if said is not None and said > _WAITED * run:
            return True
        if said is None:
            late = max(_WAITED * run, _SEEN_WAIT_MIN_S)
        else:
            late = max(run / 2, _OVERRULE_MIN_S)
        return seen is not None and seen > late

    @property
    def prompt(self) -> bool:
        """The Space had a worker free for this call when it joined (it said so, and it
        started within a tenth of a run): our other calls there could run beside it."""
        run, wait = self.run_eta_s, self.queue_wait_s
        return run is not None and wait is not None and not self.congested

    def _apply_diff(self, kind: Any, data: list[Any]) -> list[Any]:
        """Partial outputs after the first are diffs on sse_v2+ (gradio_client
        utils.py ``stream_sse_v1plus``)."""
        if kind != "process_generating" or self.session.app.protocol not in DIFF_PROTOCOLS:
            return data
        if self._diffed is None:
            self._diffed = list(data)
            return data
        for i, diff in enumerate(data):
            if i >= len(self._diffed):
                self._diffed.append(None)
            self._diffed[i] = utils.apply_diff(self._diffed[i], diff)
        return list(self._diffed)

    def _complete(self, msg: dict[str, Any]) -> None:
        output = dict(msg.get("output") or {})
        success = bool(msg.get("success", True))
        self._event(UpstreamDone(success and "data" in output))
        if self.done:
            self._close_feeds()
            return
        if not success or "error" in output:
            message = output.pop("error", None)
            self._fail(_app_error(message, output))
            return
        if "data" not in output:  # completed empty: the Space cancelled it
            self._fail(CallCancelled("the Space cancelled the call"))
            return
        value = shape_output(self.endpoint, list(output["data"]))
        if self.outputs.total == 0:
            self.outputs.append(value)
        self.result.set_result(value)
        self._close_feeds()

    def _event(self, event: UpstreamEvent) -> None:
        self.events.append(event)

    def _fail(self, error: BaseException) -> None:
        if not self.result.done():
            self.result.set_exception(error)
        self._close_feeds()

    def _close_feeds(self) -> None:
        self.outputs.close()
        self.events.close()


def _app_error(message: Any, rest: dict[str, Any]) -> AppError:
    """gradio_client client.py ``make_predict``: the app's error as ``AppError``."""
    if message is None:
        return AppError(
            "The upstream Gradio app has raised an exception but has not enabled "
            "verbose error reporting. To enable, set show_error=True in launch()."
        )
    try:
        return AppError(message=str(message), **rest)
    except TypeError:
        return AppError(str(message))


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
