"""Settings of the HTTP service, read from ``POOL_*`` variables like the pool's own.

The pool (``pool.PoolSettings``) owns everything about Spaces, connections and
admission; this module owns only what the HTTP layer decides: who may call it, how
big a request may be, default deadlines, and how long finished jobs are kept.
"""

from __future__ import annotations

import os
import tempfile
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_ON = frozenset({"true", "1", "yes", "on"})  # POOL_GRADIO_PAGES: every page served
_OFF = frozenset({"false", "0", "no", "off"})  # … none

MAX_TIMEOUT_S = 3600.0
"""The longest deadline a caller may ask for (``timeout_s``)."""


def _default_file_dir() -> str:
    # Beside the default SQLite coordinator: every worker on the host shares it.
    return os.path.join(tempfile.gettempdir(), "spacepool", "files")


class ServiceSettings(BaseSettings):
    """Knobs of the HTTP service (SPEC 6 plus the service's own)."""

    model_config = SettingsConfigDict(env_prefix="POOL_", extra="ignore")

    admin_token: SecretStr | None = Field(
        default=None, description="bearer token for /api/admin/*; unset: admin refuses"
    )
    api_token: SecretStr | None = Field(
        default=None, description="bearer token for /api/predict and /api/jobs; unset: open"
    )
    predict_timeout_s: float = Field(
        default=600.0, gt=0, le=MAX_TIMEOUT_S, description="deadline of a predict without one"
    )
    job_timeout_s: float = Field(
        default=MAX_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S, description="deadline of a job without one"
    )
    job_queue_timeout_s: float = Field(
        default=300.0, ge=0, description="longest wait for admission of a job (stage queued)"
    )
    job_retention_s: float = Field(
        default=3600.0, gt=0, description="finished jobs stay readable this long"
    )
    job_max: int = Field(default=10_000, ge=1, description="jobs kept at once (any stage)")
    max_sessions_per_user: int = Field(
        default=16, ge=1, description="open sessions (POST /api/sessions) of one email, every"
        " anonymous caller together counting as one; over it: 429 too_many_sessions"
    )
    max_queued_jobs_per_user: int = Field(
        default=32, ge=1, description="jobs of one email not yet final (queued, waking,"
        " running), anonymous callers together as one; over it: 429 too_many_jobs"
    )
    public_url: str | None = Field(
        default=None, max_length=2048, pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$",
        description="the service's address as its callers reach it (https://host/prefix):"
        " the Gradio front's config root, rewritten URLs and login redirects are built from"
        " it, not from the request's Host header",
    )
    max_streams_per_caller: int = Field(
        default=64, ge=1, description="SSE streams (job events, the front's data streams,"
        " heartbeats and REST results, streamed predicts) one caller (key and user)"
        " holds open at once in one process; over it: 429 too_many_streams"
    )
    max_body_bytes: int = Field(default=1_048_576, ge=1024, description="largest request body")
    max_upload_bytes: int = Field(
        default=10 * 1024 * 1024, ge=1, description="files sent with one request, in all"
    )
    allow_file_urls: bool = Field(
        default=False, description='fetch {"file": {"url": ...}} arguments; off: 422 (no SSRF)'
    )
    file_dir: str = Field(
        default_factory=_default_file_dir, description="download folder of output files"
    )
    file_ttl_s: float = Field(default=3600.0, gt=0, description="file URLs expire after this")
    file_max_total_bytes: int = Field(
        default=1024**3, ge=1, description="disk used by output files; oldest evicted first"
    )
    forward_ip_token: bool = Field(
        default=False,
        description="send the caller's X-IP-Token header (ZeroGPU identity) on that call's "
        "upstream requests; off: never forwarded",
    )
    file_inline_max_bytes: int = Field(
        default=256 * 1024, ge=0, description='largest file sent inline ("files": "inline")'
    )
    gradio_queue_wait_s: float | None = Field(
        default=None, ge=0, description="obsolete, ignored (a warning at start): the Gradio"
        " front's events wait for admission up to POOL_QUEUE_TIMEOUT_S, their joins"
        " answered at once"
    )
    gradio_queue_max_size: int = Field(
        default=256, ge=1, description="Gradio front: events waiting for admission in this"
        " process at once; past it a join gets the busy answer (503, as Gradio's"
        " queue max_size)"
    )
    gradio_session_idle_s: float = Field(
        default=1800.0, gt=0, description="Gradio front: a session with no event starting,"
        " no stream or heartbeat open this long ends (its unread results dropped)"
    )
    gradio_max_sessions: int = Field(
        default=128, ge=1, description="Gradio front: sessions open at once in this process;"
        " past it the clients' busy answer (503, Retry-After)"
    )
    gradio_max_sessions_per_user: int = Field(
        default=32, ge=1, description="Gradio front: sessions of one user (anonymous"
        " callers are one user) open at once; past it the busy answer"
    )

    gradio_pages: str = Field(
        default="false", max_length=4096, pattern=r"^[A-Za-z0-9_.,\s-]*$",
        description="Gradio front: serve the Spaces' own web pages to browsers at"
        " /gradio/{alias}/ and /gradio/: true, false (the default) or a comma-separated"
        " list of aliases; a page runs the Space's script on this service's origin"
        " (docs/security.md)",
    )
    cors_origins: str = Field(
        default="", max_length=8192, description="Gradio front: comma-separated origins"
        " (scheme://host[:port]) whose pages may call /gradio/ with credentials (cookies);"
        " while POOL_API_TOKEN is set, the only origins answered at all",
    )

    def pages_for(self, scope: str | None) -> bool:
        """Whether the page of ``scope`` (an alias; None for ``/gradio/``) is served."""
        words = {w.strip() for w in self.gradio_pages.split(",") if w.strip()}
        if {w.lower() for w in words} & _ON:
            return True
        return scope is not None and scope in words

    @property
    def pages_on(self) -> bool:
        """Whether any page is served (the dashboard then keeps its token in memory)."""
        words = {w.strip().lower() for w in self.gradio_pages.split(",") if w.strip()}
        return bool(words - _OFF)

    def cors_listed(self) -> frozenset[str]:
        """``POOL_CORS_ORIGINS`` as origins (lower-case, no trailing slash)."""
        return frozenset(
            o.strip().rstrip("/").lower() for o in self.cors_origins.split(",") if o.strip()
        )

    @field_validator("admin_token", "api_token", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            return None
        return value


HUB_OUTBOUND_PORTS = (80, 443, 8080)
"""The only ports a Hugging Face Space may connect out to (docs/hub.md)."""
_DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "http": 80, "https": 443}


def outbound_port_problem(url: str) -> str | None:
    """Why a Space could not reach the store ``url`` (None when it can or has no port):
    on the Hub only ports 80, 443 and 8080 go out. Never quotes the URL (a password)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    base, _, kind = scheme.partition("+")  # redis+cluster://a:1,b:2/, redis+sentinel://…
    if base not in _DEFAULT_PORTS or kind not in {"", "cluster", "sentinel"}:
        return None  # memory://, sqlite:///…: nothing goes out
    default = 26379 if kind == "sentinel" else _DEFAULT_PORTS[base]
    ports = []
    for node in parts.netloc.rpartition("@")[2].split(","):
        try:
            ports.append(urlsplit(f"//{node}").port or default)
        except ValueError:
            return None
    port = next((p for p in ports if p not in HUB_OUTBOUND_PORTS), None)
    if port is None:
        return None
    return (
        f"POOL_COORDINATOR_URL names port {port}, but a Space's outbound connections are"
        " allowed only on ports 80, 443 and 8080: the store cannot be reached from here"
        " (use a store listening on 443 or 8080; docs/hub.md)"
    )

