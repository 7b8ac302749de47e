"""A call as a request brings it: its body (JSON or multipart with files) read and checked,
and its progress as the Space reports it."""

from __future__ import annotations

from ._inputs import CheckedCall, checked_call, identity_headers, read_call
from ._progress import UpstreamView

__all__ = ["CheckedCall", "UpstreamView", "checked_call", "identity_headers", "read_call"]
