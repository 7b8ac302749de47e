"""Settings read from ``POOL_*`` environment variables (SPEC section 6)."""

from __future__ import annotations

import os
import tempfile
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ._spaces import Login, parse_logins


def _default_coordinator_url() -> str:
    path = os.path.join(tempfile.gettempdir(), "spacepool", "coordinator.db")
    return f"sqlite:///{path}"


class PoolSettings(BaseSettings):
    """Every knob of the pool, with the defaults of the design card."""

    model_config = SettingsConfigDict(env_prefix="POOL_", extra="ignore")

    spaces: str = Field(default="", description="comma-separated Space ids, URLs or alias=URL")
    min_connections: int = Field(default=5, ge=0, le=1000)
    max_connections: int = Field(default=50, ge=1, le=1000)
    idle_timeout_s: float = Field(default=600.0, gt=0)
    queue_timeout_s: float = Field(default=30.0, ge=0)
    batch_queue_timeout_s: float = Field(
        default=300.0, ge=0, description="queue timeout of batch-class requests"
    )
    batch_max_wait_s: float = Field(
        default=60.0, ge=0, description="a batch waiter ranks as interactive after this"
    )
    warmup: bool = Field(default=False, description="open each Space's minimum at start")
    warm_window_s: float = Field(
        default=3600.0, gt=0, description="idle connections kept: peak in use over this window"
    )
    health_interval_s: float = Field(default=300.0, gt=0)
    health_sample: int = Field(default=5, ge=0)
    health_failures: int = Field(default=3, ge=1, description="failed probes before discard")
    assignment_ttl_s: float = Field(default=3600.0, gt=0)
    global_max_concurrent: int = Field(default=16, ge=1)
    consumer_max_concurrent: int = Field(default=2, ge=1)
    anonymous_max_concurrent: int | None = Field(
        default=None,
        ge=1,
        description="the one per-user cap every caller without an email shares; unset:"
        " POOL_CONSUMER_MAX_CONCURRENT",
    )
    coordinator_url: str = Field(default_factory=_default_coordinator_url)
    coordinator_ca_file: str | None = Field(
        default=None,
        description="PEM file of the certificate authority of a rediss:// coordinator;"
        " unset: the system's",
    )
    allow_evicting_store: bool = Field(
        default=False,
        description="start even if the Redis coordinator may evict keys (a warning)",
    )
    lease_ttl_s: float = Field(default=15.0, gt=0, description="admission lease, renewed")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    connect_attempts: int = Field(default=3, ge=1)
    read_timeout_s: float = Field(default=60.0, gt=0)
    client_max_workers: int = Field(default=2, ge=1, le=40)
    window_initial: int = Field(default=4, ge=1, description="adaptive window at start")
    window_max: int = Field(default=100, ge=1, description="logical ceiling of the window")
    window_grow_after: int = Field(default=3, ge=1, description="successes in a row per +1")
    breaker_failures: int = Field(default=5, ge=1, description="provider failures to open")
    breaker_cooldown_s: float = Field(default=30.0, gt=0)
    retry_attempts: int = Field(default=3, ge=1, le=10, description="attempts per request")
    retry_backoff_s: float = Field(default=0.25, ge=0)
    retry_backoff_max_s: float = Field(default=5.0, ge=0)
    wake_timeout_s: float = Field(default=120.0, gt=0, description="wake deadline")
    wake_poll_s: float = Field(default=1.0, gt=0)
    idle_pause_s: float = Field(default=0.0, ge=0, description="0: never pause idle Spaces")
    pause_spaces: str = Field(default="", description="Spaces the pool may pause; * for all")
    min_uptime_s: float = Field(default=600.0, ge=0, description="no idle pause before this")
    secret_guard: Literal["auto", "on", "off"] = Field(
        default="auto", description="refuse payloads carrying secrets; auto = Hub Spaces only"
    )
    file_max_bytes: int = Field(
        default=50 * 1024 * 1024, ge=1, description="largest output file fetched from a Space"
    )
    file_timeout_s: float = Field(
        default=60.0, gt=0, description="time to fetch the output files of one result"
    )
    stream_keep: int = Field(
        default=32, ge=1, le=10_000, description="partial outputs kept per stream reader"
    )
    transport: Literal["native", "gradio_client"] = Field(
        default="native",
        description="native: the asyncio transport (pool/transport); gradio_client: the "
        "fallback, a gradio_client.Client per connection",
    )
    session_idle_s: float = Field(
        default=1800.0, gt=0, description="a session ends after this long without a call"
    )
    user_hash_key: SecretStr | None = None
    # POOL_HF_TOKEN, or HF_TOKEN: sent as x-hf-authorization (private Spaces); never shown
    hf_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("POOL_HF_TOKEN", "HF_TOKEN", "hf_token")
    )

    # POOL_SPACE_AUTH: name=username:password,… for Spaces behind Gradio's login; never shown
    space_auth: SecretStr | None = None

    @model_validator(mode="after")
    def _min_not_above_max(self) -> PoolSettings:
        if self.min_connections > self.max_connections:
            raise ValueError("POOL_MIN_CONNECTIONS must not exceed POOL_MAX_CONNECTIONS")
        return self

    @property
    def anonymous_limit(self) -> int:
        """The concurrent predicts of every anonymous caller together (one consumer)."""
        if self.anonymous_max_concurrent is None:
            return self.consumer_max_concurrent
        return self.anonymous_max_concurrent

    def pause_names(self) -> frozenset[str]:
        return frozenset(n.strip() for n in self.pause_spaces.split(",") if n.strip())

    def space_entries(self) -> list[str]:
        return [entry.strip() for entry in self.spaces.split(",") if entry.strip()]

    def space_logins(self) -> dict[str, Login]:
        """``POOL_SPACE_AUTH`` parsed (pool/_spaces.py ``parse_logins``)."""
        return parse_logins(self.space_auth.get_secret_value()) if self.space_auth else {}
