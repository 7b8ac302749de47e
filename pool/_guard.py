"""Outbound secret guard: refuse payloads that carry secrets, before they leave.

Fail closed and content-free (seed 004): the check walks every string in the
arguments (nested lists/dicts included) and refuses with
:class:`~pool.RefusedByPolicy` naming only a reason code — never the matched text.
A refusal is the caller's problem, not the Space's: it never counts as a provider
failure and nothing is sent.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ._exceptions import RefusedByPolicy

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private_key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
    ("bearer_token", re.compile(r"\bBearer\s+[A-Za-z0-9\-._~+/]{8,}=*", re.IGNORECASE)),
    ("hf_token", re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")),
    (
        "secret_assignment",
        re.compile(
            r"\b[\w.-]*(?:api[_-]?key|secret|token|passw(?:or)?d|passwd)[\w.-]*\s*[:=]\s*"
            r"['\"]?[^\s'\"]{6,}",
            re.IGNORECASE,
        ),
    ),
)
_MAX_DEPTH = 32


def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                yield key
            yield from _strings(item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item, depth + 1)


def check_outbound(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise RefusedByPolicy if any string in the payload looks like a secret."""
    for text in _strings([list(args), kwargs]):
        for reason, pattern in _PATTERNS:
            if pattern.search(text):
                raise RefusedByPolicy(
                    f"refused before sending: the payload appears to contain a secret ({reason})",
                    reason=reason,
                )
