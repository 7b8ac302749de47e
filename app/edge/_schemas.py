"""Request and response bodies of the HTTP API, with every limit a caller can hit.

Everything a caller sends is bounded here, so that no body can reach the pool (or
a Space) in a shape that would make the service fail with a 500: field lengths, the
``api_name`` shape, the number, size and nesting of ``args``/``kwargs``, finite
numbers only, and ``0 < timeout_s <= 3600``. The whole body is also capped in bytes
before it is parsed (:mod:`app.core._limits`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator
from pydantic.config import JsonDict

from pool import LocalFile

from ..core import MAX_TIMEOUT_S

Stage = Literal["queued", "waking", "running", "done", "failed", "cancelled"]
FINAL_STAGES: frozenset[str] = frozenset({"done", "failed", "cancelled"})

MAX_ARGS = 64
MAX_KWARGS = 64
MAX_DEPTH = 32
MAX_PAYLOAD_BYTES = 512 * 1024
# Keyword names gradio_client's submit() takes for itself: a caller must not reach them.
RESERVED_KWARGS = frozenset({"api_name", "fn_index", "headers", "result_callbacks", "timeout"})

API_NAME_PATTERN = r"^/?[A-Za-z_][A-Za-z0-9_.-]{0,127}$"
SPACE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
# No "@", whitespace or control character: written out, not as \s, which the JSON
# schema's (ECMA) and the validator's (Rust regex, Unicode White_Space) engines read
# differently (U+0085 is whitespace to one only: schemathesis found it).
_NOT_IN_EMAIL = r"@\x00-\x20\x7f-\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
EMAIL_PATTERN = rf"^[^{_NOT_IN_EMAIL}]{{1,64}}@[^{_NOT_IN_EMAIL}]{{1,189}}$"
EMAIL_MAX_CHARS = 254
_EMAIL = re.compile(EMAIL_PATTERN)


def is_email(value: str) -> bool:
    """The JSON API's rule for an ``email`` (both faces name users by it)."""
    return len(value) <= EMAIL_MAX_CHARS and _EMAIL.fullmatch(value) is not None
KWARG_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
_RESERVED: list[JsonValue] = [*sorted(RESERVED_KWARGS)]
_KWARG_NAMES_SCHEMA: JsonDict = {
    "propertyNames": {"pattern": KWARG_PATTERN, "not": {"enum": _RESERVED}}
}


def is_file_form(value: Any) -> bool:
    """A file argument: ``{"file": {...}}`` and nothing else (see app.calls._inputs)."""
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("file"), dict)


def _without_b64(value: Any) -> Any:
    """``value`` with the base64 of file arguments left out (bounded elsewhere)."""
    if is_file_form(value):
        return {"file": {k: v for k, v in value["file"].items() if k != "b64"}}
    if isinstance(value, dict):
        return {k: _without_b64(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_b64(v) for v in value]
    return value


def json_problem(value: Any) -> str | None:
    """Why ``value`` (parsed JSON) cannot be sent on, or None: depth and finite numbers.

    Iterative, so that a deeply nested body cannot exhaust the Python stack.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return "numbers must be finite (no NaN or Infinity)"
        if isinstance(item, (list, dict)):
            if depth > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels"
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return None


class PredictRequest(BaseModel):
    """Body of ``POST /api/predict`` and ``POST /api/jobs``."""

    model_config = ConfigDict(extra="forbid")

    email: str | None = Field(
        default=None,
        max_length=EMAIL_MAX_CHARS,
        pattern=EMAIL_PATTERN,
        description="the caller's user; pins them to one Space. Absent: anonymous",
    )
    space: str | None = Field(
        default=None,
        max_length=128,
        pattern=SPACE_PATTERN,
        description="a configured Space name to use; absent: the pool routes",
    )
    session: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[A-Za-z0-9_-]{16,64}$",
        description="a session from POST /api/sessions: the call continues it (same email)",
    )
    api_name: str = Field(
        max_length=129, pattern=API_NAME_PATTERN, description="endpoint, e.g. /predict"
    )
    args: list[Any] = Field(default_factory=list, max_length=MAX_ARGS)
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        max_length=MAX_KWARGS,
        # What _kwarg_names enforces, said in the OpenAPI too (so the schema is the truth).
        json_schema_extra=_KWARG_NAMES_SCHEMA,
    )
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TIMEOUT_S,
        allow_inf_nan=False,
        description="deadline in seconds for the whole request (wait + run)",
    )
    priority: Literal["interactive", "batch"] = Field(
        default="interactive",
        description="scheduling class: interactive waiters go first; a batch one ranks as"
        " interactive after POOL_BATCH_MAX_WAIT_S and waits up to POOL_BATCH_QUEUE_TIMEOUT_S",
    )
    safe_to_retry: bool = Field(
        default=False,
        description="the call is idempotent: retry it even after the Space accepted it"
        " (calls the Space never accepted are retried anyway)",
    )
    files: Literal["url", "inline"] = Field(
        default="url",
        description="output files as a URL under /api/files/ (default), or inline base64"
        " when at most POOL_FILE_INLINE_MAX_BYTES",
    )
    stream: bool = Field(
        default=False,
        description="POST /api/predict only: answer with Server-Sent Events, one per partial"
        " output, then the result (same as Accept: text/event-stream); jobs always stream",
    )

    @field_validator("api_name")
    @classmethod
    def _leading_slash(cls, value: str) -> str:
        return value if value.startswith("/") else "/" + value

    @field_validator("kwargs")
    @classmethod
    def _kwarg_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if key in RESERVED_KWARGS:
                raise ValueError(f"{key!r} is reserved; pass it as a top-level field")
            if not re.fullmatch(KWARG_PATTERN, key):
                raise ValueError("keyword names must be Python identifiers of ≤ 64 characters")
        return value

    @model_validator(mode="after")
    def _payload_shape(self) -> PredictRequest:
        problem = json_problem(self.args) or json_problem(self.kwargs)
        if problem:
            raise ValueError(f"args/kwargs: {problem}")
        # The base64 of file arguments is bounded by POOL_MAX_UPLOAD_BYTES instead.
        shape = _without_b64([self.args, self.kwargs])
        size = len(json.dumps(shape, ensure_ascii=False).encode())
        if size > MAX_PAYLOAD_BYTES:
            raise ValueError(f"args/kwargs: {size} bytes, more than {MAX_PAYLOAD_BYTES}")
        return self


class PredictResponse(BaseModel):
    """Body of a successful ``POST /api/predict``."""

    space: str
    result: Any
    queued_ms: float = Field(description="time waiting for admission and a connection")
    duration_ms: float = Field(description="time the Space took, once admitted")
    attempts: int = Field(default=1, description="calls made (more than 1 after retries)")


class JobCreated(BaseModel):
    """Body of ``202`` from ``POST /api/jobs``."""

    job_id: str
    stage: Stage
    url: str
    events_url: str


class JobView(BaseModel):
    """What ``GET /api/jobs/{id}`` returns and every SSE event carries."""

    job_id: str
    stage: Stage
    version: int = Field(description="grows by one with every change (the SSE event id)")
    created_at: str
    updated_at: str
    queue_position: int | None = Field(default=None, description="while queued")
    estimate_s: float | None = Field(default=None, description="while queued: expected wait")
    space: str | None = None
    result: Any = Field(default=None, description="when done")
    error: dict[str, Any] | None = Field(default=None, description="when failed or cancelled")
    queued_ms: float | None = None
    duration_ms: float | None = None
    partial: Any = Field(
        default=None, description="while running (and after a failure): the latest partial output"
    )
    partial_index: int | None = Field(
        default=None, description="index (0, 1, ...) of the latest partial output"
    )
    requeued: int | None = Field(
        default=None,
        description="times the job was run again on another worker after its own was lost",
    )


class ErrorBody(BaseModel):
    """Every error the service answers has this shape (plus code-specific keys)."""

    model_config = ConfigDict(extra="allow")

    error: str = Field(description="a short code: busy, upstream, deadline, invalid_body, ...")
    message: str | None = None
    request_id: str | None = None


FileRenderer = Callable[[LocalFile], Any]


def to_jsonable(value: Any, files: FileRenderer | None = None) -> Any:
    """``value`` as plain JSON (a Space's output is usually JSON already).

    The one conversion every output path uses. A downloaded output file
    (:class:`pool.LocalFile`) becomes ``files(it)`` — ``{"file": {"url", …}}`` or
    inline base64 (:class:`app.edge._files.FileOutput`) — or, without ``files``, its name,
    size and type only (never a path of this host). Non-finite floats become None and
    unknown objects their ``str``; never raises.
    """
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError, RecursionError):
        pass
    return _convert(value, 0, files)


def _convert(value: Any, depth: int, files: FileRenderer | None = None) -> Any:
    if depth > 64:
        return None
    if isinstance(value, LocalFile):
        if files is not None:
            return files(value)
        return {"file": {"name": value.name, "size": value.size, "mime_type": value.mime_type}}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _convert(v, depth + 1, files) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_convert(v, depth + 1, files) for v in value]
    try:
        return str(value)
    except Exception:
        return None


# The error answers of the API routes, for their OpenAPI "responses" (app.core._errors maps them).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        400: "a body that cannot be parsed (malformed JSON or multipart)",
        401: "missing or wrong bearer token",
        403: "admin endpoints: POOL_ADMIN_TOKEN unset, or not the admin token",
        404: "unknown job, or unknown/expired session (session_not_found)",
        410: "the session's Space restarted: its state is gone (session_lost)",
        413: "body too large",
        422: "invalid body, unknown api_name or Space, ambiguous endpoint, refused by policy",
        429: "the caller's GPU quota on a ZeroGPU Space is spent (Retry-After)",
        502: "the Space failed",
        503: "busy (Retry-After), no healthy Space, shutting down",
        504: "deadline exceeded",
    }.items()
}
