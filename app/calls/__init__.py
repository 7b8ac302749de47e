"""A call as a request brings it: its body (JSON or multipart with files) read and checked,
and its progress as the Space reports it."""

from __future__ import annotations

from ._inputs import CheckedCall, checked_call, identity_headers, read_call
from ._progress import UpstreamView
from ._reading import BODY_DOC, file_output, prepare, read_checked

__all__ = [
    "BODY_DOC",
    "CheckedCall",
    "UpstreamView",
    "checked_call",
    "file_output",
    "identity_headers",
    "prepare",
    "read_call",
    "read_checked",
]
