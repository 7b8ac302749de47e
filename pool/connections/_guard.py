"""Outbound secret guard: refuse payloads that carry secrets, before they leave.

Fail closed and content-free (seed 004): the check walks every string in the
arguments (nested lists/dicts included) and refuses with
:class:`~pool.RefusedByPolicy` naming only a reason code — never the matched text.
A refusal is the caller's problem, not the Space's: it never counts as a provider
failure and nothing is sent.

Linear time (issue 28): an argument may be 512 KiB, and the check used to run a
``\\b[\\w.-]*KEYWORD[\\w.-]*\\s*[:=]...`` search whose nested stars backtracked
cubically ("token." * 500, 3,000 characters, took 5-9 s; 6,000 took 43 s), stalling
the event loop. Now no rule can backtrack more than a constant:

* ``secret_assignment`` walks the maximal runs of ``[\\w.-]`` once; a run that
  contains a keyword is a hit if ``\\s*[:=]\\s*['"]?`` and six value characters
  follow its end. That is the old pattern's meaning: the value part starts with a
  character outside ``[\\w.-]``, so the old match's name part always ended where its
  run ended; and a ``\\b`` always lies at or before a keyword inside its run (a keyword
  starts with a word character), so "the run contains a keyword" is the whole test.
* the other three rules are single regexes whose repeats are possessive or cannot
  give anything back (each repeated class is disjoint from what follows it), and
  ``{n,}`` became ``{n}`` where only "at least n" matters to a yes/no search.

No size bound is needed: the cost is a few passes over the text. The service caps a
body at 512 KiB; :func:`outbound_chars` lets :meth:`pool.PooledClient.submit` move the
check off the event loop above :data:`INLINE_CHARS`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

from .._exceptions import RefusedByPolicy

_FLAGS = re.IGNORECASE
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # Lazy over words, possessive inside one: a word ends at its space, and
    # "PRIVATE KEY-----" is tried before each further word is taken.
    ("private_key", re.compile(r"-----BEGIN (?:[A-Z0-9]++ )*?PRIVATE KEY-----")),
    # "{8,}=*" only ever needed its first eight characters to say yes.
    ("bearer_token", re.compile(r"\bBearer\s++[A-Za-z0-9\-._~+/]{8}", _FLAGS)),
    # Giving back an alphanumeric never makes a \b (one is still next), so the
    # possessive run means what the greedy one did.
    ("hf_token", re.compile(r"\bhf_[A-Za-z0-9]{20,}+\b")),
)
_NAME_RUN = re.compile(r"[\w.-]+", _FLAGS)
_KEYWORD = re.compile(r"api[_-]?key|secret|token|passw(?:or)?d|passwd", _FLAGS)
_ASSIGNED_VALUE = re.compile(r"\s*+[:=]\s*+['\"]?+[^\s'\"]{6}", _FLAGS)
_MAX_DEPTH = 32

INLINE_CHARS = 64 * 1024
"""Payloads with more string characters than this are checked in a worker thread."""


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


def _has_secret_assignment(text: str) -> bool:
    """``name = value`` where the name contains a keyword (one pass over the runs)."""
    for run in _NAME_RUN.finditer(text):
        if _ASSIGNED_VALUE.match(text, run.end()) and _KEYWORD.search(text, run.start(), run.end()):
            return True
    return False


def _reason(text: str) -> str | None:
    for reason, pattern in _PATTERNS:
        if pattern.search(text):
            return reason
    if _has_secret_assignment(text):
        return "secret_assignment"
    return None


def outbound_chars(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """How many characters :func:`check_outbound` would read in this payload."""
    return sum(len(text) for text in _strings([list(args), kwargs]))


def check_outbound(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise RefusedByPolicy if any string in the payload looks like a secret."""
    for text in _strings([list(args), kwargs]):
        reason = _reason(text)
        if reason is not None:
            raise RefusedByPolicy(
                f"refused before sending: the payload appears to contain a secret ({reason})",
                reason=reason,
            )


async def check_outbound_off_loop(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """:func:`check_outbound`, in a worker thread when the payload is large."""
    if outbound_chars(args, kwargs) > INLINE_CHARS:
        await asyncio.to_thread(check_outbound, args, kwargs)
    else:
        check_outbound(args, kwargs)
