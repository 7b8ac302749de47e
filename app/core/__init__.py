"""The service core every face stands on: settings, errors and their answers, the JSON
access log, metrics, tracing, draining, the body-size cap, the checks at start and the
per-caller stream caps."""

from __future__ import annotations

from . import _errors as errors
from . import _metrics as metrics
from . import _startup as startup
from . import _tracing as tracing
from ._draining import Draining
from ._errors import (
    AuthError,
    FileNotFound,
    IdempotencyKeyInUse,
    IdempotencyKeyReused,
    InvalidFileReference,
    JobNotFound,
    JobsFull,
    KeyNameTaken,
    KeyNotFound,
    UploadTooLarge,
    describe,
)
from ._limits import BodySizeLimit
from ._logging import AccessLog, RequestContext, configure_logging, context_of
from ._metrics import TEAM_REGISTRY, on_pool_event
from ._services import Services, services_of, settings_of
from ._settings import MAX_TIMEOUT_S, ServiceSettings, outbound_port_problem
from ._streams import KEEPALIVE_S, StreamCaps, bounded, hold_stream
from ._tracing import TraceRequests

__all__ = [
    "KEEPALIVE_S",
    "MAX_TIMEOUT_S",
    "TEAM_REGISTRY",
    "AccessLog",
    "AuthError",
    "BodySizeLimit",
    "Draining",
    "FileNotFound",
    "IdempotencyKeyInUse",
    "IdempotencyKeyReused",
    "InvalidFileReference",
    "JobNotFound",
    "JobsFull",
    "KeyNameTaken",
    "KeyNotFound",
    "RequestContext",
    "ServiceSettings",
    "Services",
    "StreamCaps",
    "TraceRequests",
    "UploadTooLarge",
    "bounded",
    "configure_logging",
    "context_of",
    "describe",
    "errors",
    "hold_stream",
    "metrics",
    "on_pool_event",
    "outbound_port_problem",
    "services_of",
    "settings_of",
    "startup",
    "tracing",
]
