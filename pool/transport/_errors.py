"""Map errors of gradio_client, httpx and huggingface_hub into our tree.

This is the only module that knows their exception types. ``classify`` returns the
error to raise and whether the connection that saw it must be discarded.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass

import httpx
from gradio_client.exceptions import AppError, AuthenticationError, ValidationError
from gradio_client.utils import QueueError, TooManyRequestsError

from .._exceptions import (
    InvalidRequest,
    PoolError,
    UpstreamAppError,
    UpstreamError,
    UpstreamTransportError,
)
from .._failures import failure
from ._app import ProtocolNotSupported
from ._queue import CallCancelled, SessionDropped
from ._quota import quota_error


@dataclass(frozen=True)
class Classified:
    error: PoolError
    discard_connection: bool

    @property
    def provider_failure(self) -> bool:
        return failure(self.error.kind).provider


def _transport(
    kind: str, message: str, discard: bool = True, *, before_accept: bool = False
) -> Classified:
    return Classified(UpstreamTransportError(message, kind=kind, before_accept=before_accept),
                      discard)


def classify(exc: BaseException) -> Classified:
    """Our error for ``exc`` raised by the transport while serving a request."""
    if isinstance(exc, PoolError):
        return Classified(exc, False)
    if isinstance(exc, AppError):
        quota = quota_error(str(exc))
        if quota is not None:  # a ZeroGPU Space: the caller's quota, not a bug
            return Classified(quota, False)
        # The app raised: its own message is meant for the caller (gr.Error).
        return Classified(UpstreamAppError(str(exc) or "the Space's app raised"), False)
    if isinstance(exc, ValidationError):
        return Classified(InvalidRequest(f"the Space rejected the input: {exc}"), False)
    if isinstance(exc, QueueError):
        return _transport(
            "queue_full", "the Space's queue is full", discard=False, before_accept=True
        )
    if isinstance(exc, TooManyRequestsError):
        wait = getattr(exc, "retry_after_s", None)  # RateLimited: the Hub's Retry-After
        # Still waiting out an earlier 429 (nothing asked): not another failure.
        kind = "rate_limited" if getattr(exc, "asked", True) else "rate_limit_wait"
        error = UpstreamTransportError("the Space is rate limiting (429)", kind=kind,
                                       before_accept=True, retry_after_s=wait)  # fmt: skip
        return Classified(error, False)
    if isinstance(exc, AuthenticationError):
        return Classified(UpstreamError("the Space refused our credentials (401: POOL_HF_TOKEN,"
                                        " POOL_SPACE_AUTH)"), True)  # fmt: skip
    if isinstance(exc, httpx.ConnectError):
        return _transport("connect", "could not connect to the Space", before_accept=True)
    if isinstance(exc, httpx.ConnectTimeout):
        return _transport("timeout", "the Space did not answer in time", before_accept=True)
    if isinstance(exc, httpx.TimeoutException):
        return _transport("timeout", "the Space did not answer in time")
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        if status >= 500:
            return _transport("http_5xx", f"the Space answered HTTP {status}")
        return Classified(UpstreamError(f"the Space answered HTTP {status}"), False)
    if isinstance(exc, httpx.TransportError):
        return _transport("transport", "the connection to the Space failed")
    if isinstance(exc, SessionDropped):
        return _transport("dropped", "the Space dropped the job (restarted, killed or cut)")
    if isinstance(exc, CallCancelled):
        return Classified(UpstreamError("the Space cancelled the job"), True)
    if isinstance(exc, ProtocolNotSupported):
        return _transport("invalid_state", f"the Space speaks an unknown protocol ({exc})")
    if isinstance(exc, concurrent.futures.CancelledError):
        return _transport("dropped", "the Space dropped the job (restarted or killed)")
    if isinstance(exc, (ConnectionError, OSError)):
        return _transport("transport", "the connection to the Space failed")
    return Classified(UpstreamError(f"unexpected upstream failure ({type(exc).__name__})"), True)


def classify_connect(exc: BaseException) -> Classified:
    """Our error for a failure while opening a connection (``Client(...)``)."""
    if isinstance(exc, ValueError) and "invalid state" in str(exc):
        return _transport("invalid_state", "the Space is in an invalid state")
    if isinstance(exc, ValueError) and str(exc).startswith("Could not login"):
        # gradio_client client.py ``_login``: Gradio answered 400 "Incorrect credentials."
        return classify(AuthenticationError(str(exc)))
    if type(exc).__name__ in {"RepositoryNotFoundError", "HfHubHTTPError"}:
        return _transport("not_found", "the Space was not found or is private")
    return classify(exc)
