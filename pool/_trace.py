"""Traces: OpenTelemetry spans of a call, through the API only (issue 32).

The pool never configures OpenTelemetry: with no tracer provider set (the library used
on its own) every span here is the API's no-op and costs a few attribute lookups. The
service sets one (app/core/_tracing.py: OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set); a
library user may set their own.

One trace per call: the HTTP request's span (the service), else ``spacepool.predict``
(a library predict) is the root, and under it

* ``spacepool.admission`` — the wait for the slots (from the pool's ``admitted`` /
  ``busy`` event: the hook runs in the call's task, so the span is placed after the
  fact, with its real start), ``spacepool.wake`` likewise;
* ``spacepool.checkout`` — a connection checked out (opened if need be);
* ``spacepool.space_call`` — one call on the Space (its ``traceparent`` is sent
  upstream on every request of the call), with ``spacepool.upload``,
  ``spacepool.space_queue`` (joined until the Space started it) and ``spacepool.run``;
* ``spacepool.download`` — the result's files fetched;
* retries and failovers as events of the current span.

Attributes are ``spacepool.space``, ``spacepool.api_name``, ``spacepool.outcome``
(``ok`` or an error kind) and ``spacepool.key`` (the consumer's name,
pool/_consumer.py) — never an email, a token or a payload: nothing else is ever set.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, Status, StatusCode

from ._consumer import current as current_consumer

if TYPE_CHECKING:
    from ._events import PoolEvent

_tracer: trace.Tracer = trace.get_tracer("spacepool")  # the global provider's (a proxy)
_T = TypeVar("_T")
_SPACE: ContextVar[str | None] = ContextVar("spacepool_trace_space", default=None)
"""The Space of the call's current attempt (set by its checkout) for the steps below it."""


def _attributes(space: str | None = None, api_name: str | None = None) -> dict[str, str]:
    found = {"spacepool.space": space or _SPACE.get(), "spacepool.api_name": api_name}
    consumer = current_consumer()
    if consumer is not None:
        found["spacepool.key"] = consumer.name
    return {k: v for k, v in found.items() if v is not None}


def outcome_of(exc: BaseException | None) -> str:
    """``ok``, or the error's kind (a PoolError's ``kind``, else its class name)."""
    if exc is None:
        return "ok"
    return str(getattr(exc, "kind", None) or type(exc).__name__)


def _finish(span: Span, exc: BaseException | None, end_ns: int | None = None) -> None:
    span.set_attribute("spacepool.outcome", outcome_of(exc))
    if exc is not None:
        span.set_status(Status(StatusCode.ERROR, outcome_of(exc)))
    span.end(end_time=end_ns)


@contextlib.contextmanager
def span(name: str, *, space: str | None = None, api_name: str | None = None) -> Iterator[Span]:
    """A span around a step, current inside it; its outcome from how the step ends."""
    with _tracer.start_as_current_span(
        name, attributes=_attributes(space, api_name), end_on_exit=False,
        record_exception=False, set_status_on_exception=False,
    ) as current:  # fmt: skip
        try:
            yield current
        except BaseException as exc:
            _finish(current, exc)
            raise
        _finish(current, None)


def use_provider(provider: trace.TracerProvider | None) -> None:
    """Trace to ``provider`` instead of the global one (None: the global one again)."""
    global _tracer
    _tracer = (provider or trace).get_tracer("spacepool")


def tracer() -> trace.Tracer:
    """The tracer spans are made with (the service's HTTP spans too)."""
    return _tracer


async def traced(name: str, step: Awaitable[_T], *, space: str | None = None) -> _T:
    """``await step`` in a span ``name``; a ``space`` is the attempt's from then on."""
    if space is not None:
        _SPACE.set(space)
    with span(name, space=space):
        return await step


def on_event(event: PoolEvent) -> None:
    """A pool hook: admission waits and wakes as spans placed after the fact, retries and
    failovers as events of the call's span (it runs in the call's own task)."""
    parent = trace.get_current_span()
    if not parent.is_recording():
        return
    if event.kind in ("admitted", "busy", "wake"):
        end = time.time_ns()
        name = "spacepool.wake" if event.kind == "wake" else "spacepool.admission"
        step = _tracer.start_span(name, attributes=_attributes(event.space),
                                  start_time=end - int(event.seconds * 1e9))  # fmt: skip
        step.set_attribute("spacepool.outcome", "ok" if event.kind == "admitted" else
                           str(event.outcome or event.kind))  # fmt: skip
        step.end(end_time=end)
    elif event.kind in ("retry", "failover"):
        parent.add_event(f"spacepool.{event.kind}", {
            "spacepool.space": event.space or "", "spacepool.outcome": event.outcome or "",
        })  # fmt: skip


class CallSpans:
    """The spans of one call on a Space (``spacepool.space_call`` and its steps), made
    by the transport as the call goes; the call's ``traceparent`` for its requests."""

    def __init__(self, api_name: str | None) -> None:
        self._attrs = _attributes(None, api_name)  # the caller's: callbacks run elsewhere
        self._span = _tracer.start_span("spacepool.space_call", attributes=self._attrs)
        self._context = trace.set_span_in_context(self._span)
        self._joined_ns: int | None = None
        self._started_ns: int | None = None
        self._ended = False

    def headers(self) -> dict[str, str]:
        """``traceparent`` (W3C) of this call, for every request it sends upstream."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=self._context)
        return carrier

    @contextlib.contextmanager
    def upload(self) -> Iterator[None]:
        token = otel_context.attach(self._context)
        try:
            with span("spacepool.upload"):
                yield
        finally:
            otel_context.detach(token)

    def joined(self) -> None:
        self._joined_ns = time.time_ns()

    def started(self) -> None:
        if self._started_ns is None:
            self._started_ns = time.time_ns()

    def ended(self, result: Any) -> None:
        """The call's result future is done (a done callback): close every span."""
        if self._ended:
            return
        self._ended = True
        exc = None if result.cancelled() else result.exception()
        if result.cancelled():
            exc = _Cancelled()
        end = time.time_ns()
        if self._joined_ns is not None:
            queue_end = self._started_ns or end
            self._step("spacepool.space_queue", self._joined_ns, queue_end, None)
            if self._started_ns is not None:
                self._step("spacepool.run", self._started_ns, end, exc)
        _finish(self._span, exc, end)

    def _step(self, name: str, start: int, end: int, exc: BaseException | None) -> None:
        step = _tracer.start_span(name, context=self._context, start_time=start,
                                  attributes=self._attrs)  # fmt: skip
        _finish(step, exc, end)


class _Cancelled(Exception):
    kind = "cancelled"
