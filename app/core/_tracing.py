"""The service's traces: OTLP export when configured, one server span per request.

* :func:`configure` — with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set (and no tracer provider
  set by someone else), an SDK provider exporting over OTLP/HTTP in batches (the
  exporter reads the standard ``OTEL_EXPORTER_OTLP_*`` variables); without it nothing:
  the pool's spans are the API's no-ops (pool/_trace.py).
* :class:`TraceRequests` — a pure ASGI middleware: each HTTP request is a server span
  named ``<METHOD> <route template>``, a child of the caller's W3C ``traceparent`` when
  it sends one; the pool's spans of the call nest under it, and the Space's requests
  carry it on. Attributes: method, route template, status, the API key's name
  (app/edge/_auth.py) — never the path with its query, a header or a body.
"""

from __future__ import annotations

import logging
import os

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pool import tracer

_log = logging.getLogger("spacepool.app")


def configure() -> trace.TracerProvider | None:
    """The OTLP provider when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (else None)."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):  # the host application set its own
        return None
    name = os.environ.get("OTEL_SERVICE_NAME", "spacepool")
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _log.info("traces exported over OTLP")
    return provider


def shutdown(provider: trace.TracerProvider | None) -> None:
    """Flush and stop the provider :func:`configure` made."""
    stop = getattr(provider, "shutdown", None)
    if stop is not None:
        stop()


class TraceRequests:
    """One server span per HTTP request (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())
                   if k in (b"traceparent", b"tracestate")}  # fmt: skip
        method = str(scope.get("method", ""))
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        with tracer().start_as_current_span(
            method, context=propagate.extract(carrier), kind=SpanKind.SERVER,
            attributes={"http.request.method": method},
        ) as span:  # fmt: skip
            try:
                await self.app(scope, receive, sending)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if isinstance(route, str):
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                span.set_attribute("spacepool.outcome", "ok" if status < 400 else f"http_{status}")
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
