"""The one table of failure kinds: what each says about a Space, and what the pool does.

Every decision on a failure reads :func:`failure`: the provider-failure metric and the
shared window and breaker (``provider``), routing around a Space (``down``), opening a
connection again (``reopen``), and the retry policy (``retry``). ``docs/resilience.md``
shows the same table for readers.

Where a failure happens decides the rest, the same for every kind:

* **before the call is placed** (waking the Space, admission, checking out or opening
  a connection): the request fails over to the next candidate Space at once, and the
  Space is marked down for a cool-down (unless it is booting: its wake deadline
  decides). A provider failure there also counts against the Space's breaker.
* **while the call runs**: the Space is marked down only for a ``down`` kind; the
  call is repeated (preferably elsewhere) only as the retry policy allows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Failure:
    """What one kind of failure means."""

    #: The Space, not the caller, is in trouble: counted as a provider error, halves its
    #: window and counts toward its breaker.
    provider: bool = False
    #: Seen while a call runs, it means the Space is unreachable: route around it for a
    #: cool-down and close its idle connections.
    down: bool = False
    #: Worth another attempt (with backoff) when opening a connection fails so.
    reopen: bool = False
    #: The retry policy may repeat a call that failed so: always when the Space never
    #: accepted it (``before_accept``), else only if the caller said it is safe.
    retry: bool = False


_PROVIDER = Failure(provider=True, retry=True)
FAILURES: dict[str, Failure] = {
    # could not reach the Space (refused, DNS, TLS): it is not there
    "connect": Failure(provider=True, down=True, reopen=True, retry=True),
    # the Space dropped a running job (killed or restarted)
    "dropped": Failure(provider=True, down=True, retry=True),
    "timeout": Failure(provider=True, reopen=True, retry=True),
    "transport": Failure(provider=True, reopen=True, retry=True),
    "http_5xx": Failure(provider=True, reopen=True, retry=True),
    "rate_limited": Failure(provider=True, reopen=True, retry=True),
    # an earlier 429's Retry-After is not over: nothing was asked of the Space, so
    # nothing is learned (a caller retrying meanwhile must not open its breaker)
    "rate_limit_wait": Failure(retry=True),
    "queue_full": _PROVIDER,
    # the Space did not answer within the caller's deadline
    "deadline": Failure(provider=True),
    # opening: the Hub says the Space is broken, or does not know it
    "invalid_state": _PROVIDER,
    "not_found": _PROVIDER,
    # the Space sleeps, is paused or failed to boot: fail over, but it says nothing
    # about its capacity (not a provider failure)
    "wake_timeout": Failure(down=True),
    "paused": Failure(down=True),
    "space_error": Failure(down=True),
    # a ZeroGPU Space refused the caller's identity (its GPU quota): the user's limit,
    # not the Space's; neutral, never retried nor failed over (pool/transport/_quota.py)
    "quota_exceeded": Failure(),
}
_NEUTRAL = Failure()  # the caller's own error, a policy refusal, the app raising, ...


def failure(kind: str) -> Failure:
    """The row of ``kind`` (a kind not in the table is neutral: the Space is fine)."""
    return FAILURES.get(kind, _NEUTRAL)
