"""The pure rules behind the window, the breaker, waking, pausing and retries."""

from __future__ import annotations

import random

import pytest

from pool import DeadlineExceeded, UpstreamAppError, UpstreamTransportError
from pool.resilience import HealthParams, RetryPolicy, SpaceHealth
from pool.resilience._health import (
    begin_wake,
    end_wake,
    give_up_wake,
    may_pause,
    record,
    take_probe,
)

P = HealthParams(initial=4, ceiling=6, grow_after=3, breaker_failures=3, cooldown_s=10)


def fresh(now: float = 0.0) -> SpaceHealth:
    return SpaceHealth.loads(None, P, now)


def test_window_grows_by_one_per_three_successes_up_to_the_ceiling() -> None:
    """+1 after every 3 successes in a row, never above the ceiling."""
    h, seen = fresh(), []
    for _ in range(12):
        h = record(h, "success", 1.0, P)
        seen.append(h.window)
    assert seen == [4, 4, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6]
    assert h.peak == 6


def test_failure_halves_to_a_floor_of_one_and_resets_the_streak() -> None:
    """Each provider failure halves the window (floor 1) and restarts the success count."""
    h = record(record(fresh(), "success", 1, P), "success", 1, P)
    h = record(h, "failure", 1, P)
    assert (h.window, h.streak) == (2, 0)
    h = record(h, "failure", 1, P)
    assert h.window == 1
    h = record(SpaceHealth(window=1, initial=4, peak=4, ceiling=6), "failure", 1, P)
    assert h.window == 1


def test_neutral_outcomes_move_nothing() -> None:
    """A caller error or refusal changes neither window, streak nor failure count."""
    h = record(fresh(), "failure", 1, P)
    after = record(h, "neutral", 2, P)
    assert (after.window, after.streak, after.failures) == (h.window, h.streak, h.failures)


def test_breaker_opens_probes_once_and_closes_low() -> None:
    """N failures open it; after the cool-down one probe is granted (not two); its
    success closes the breaker with the window at 1."""
    h = fresh()
    for _ in range(3):
        h = record(h, "failure", 100.0, P)
    assert h.breaker == "open" and h.open_until == 110.0 and not h.admits()
    assert take_probe(h, 105.0, P) is None, "no probe during the cool-down"
    probing = take_probe(h, 110.0, P)
    assert probing is not None and probing.breaker == "half_open"
    assert take_probe(probing, 111.0, P) is None, "one probe at a time"
    closed = record(probing, "success", 112.0, P)
    assert (closed.breaker, closed.window, closed.failures) == ("closed", 1, 0)
    assert closed.transitions == 3  # closed→open→half_open→closed


def test_failed_probe_reopens_and_a_lost_probe_expires() -> None:
    """A probe's failure reopens for another cool-down; a probe nobody reports on is
    given up after its timeout."""
    h = fresh()
    for _ in range(3):
        h = record(h, "failure", 0.0, P)
    probing = take_probe(h, 10.0, P)
    assert probing is not None
    reopened = record(probing, "failure", 11.0, P)
    assert reopened.breaker == "open" and reopened.open_until == 21.0
    assert take_probe(probing, 10.0 + P.probe_timeout_s, P) is not None


def test_failures_while_waking_count_for_nothing() -> None:
    """Before the wake deadline a booting Space's failures move neither window nor
    breaker; after it they count again."""
    h = begin_wake(fresh(), 0.0, 60.0)
    for _ in range(5):
        h = record(h, "failure", 30.0, P)
    assert (h.window, h.failures, h.breaker) == (4, 0, "closed")
    h = give_up_wake(h, 61.0)
    assert record(h, "failure", 62.0, P).window == 2
    woke = end_wake(begin_wake(fresh(), 0.0, 60.0), 20.0)
    assert not woke.waking(21.0) and woke.woke_at == 20.0


def test_pause_needs_idle_period_and_minimum_uptime() -> None:
    """Paused only when idle long enough AND up long enough; never while waking."""
    h = SpaceHealth(window=4, initial=4, peak=4, ceiling=6, woke_at=0.0, last_active=0.0)
    assert not may_pause(h, 50.0, idle_s=30, min_uptime_s=100), "up-time not reached"
    assert may_pause(h, 100.0, idle_s=30, min_uptime_s=100)
    busy_lately = SpaceHealth(window=4, initial=4, peak=4, ceiling=6, last_active=90.0)
    assert not may_pause(busy_lately, 100.0, idle_s=30, min_uptime_s=0), "not idle long"
    assert not may_pause(begin_wake(h, 100.0, 60), 100.0, idle_s=0, min_uptime_s=0)


def test_a_record_survives_a_round_trip_and_adopts_a_new_ceiling() -> None:
    """The stored JSON reads back equal; a lower ceiling clamps the window."""
    h = record(record(fresh(), "failure", 1, P), "success", 2, P)
    assert SpaceHealth.loads(h.dumps(), P, 3.0) == h
    lower = HealthParams(ceiling=1)
    assert SpaceHealth.loads(h.dumps(), lower, 3.0).window == 1
    assert SpaceHealth.loads("not json", P, 5.0) == fresh(5.0)


@pytest.mark.parametrize(
    ("error", "safe", "retried"),
    [
        (UpstreamTransportError("full", kind="queue_full", before_accept=True), False, True),
        (UpstreamTransportError("dropped", kind="dropped"), False, False),
        (UpstreamTransportError("dropped", kind="dropped"), True, True),
        (UpstreamAppError("the app raised"), True, False),
        (DeadlineExceeded("late"), True, False),
    ],
)
def test_retry_only_transient_and_safe(error: Exception, safe: bool, retried: bool) -> None:
    """Provider failures the Space never accepted are retried; accepted ones only when
    the caller says so; caller errors and deadlines never; never past the attempts."""
    policy = RetryPolicy(attempts=3)
    assert policy.should_retry(error, 1, safe_to_retry=safe) is retried  # type: ignore[arg-type]
    assert policy.should_retry(error, 3, safe_to_retry=safe) is False  # type: ignore[arg-type]


def test_backoff_is_jittered_and_capped() -> None:
    """Delays lie in [0, min(max, base·2^(n-1))] and are not all equal."""
    policy, rng = RetryPolicy(attempts=10, base_s=0.1, max_s=0.5), random.Random(7)
    delays = [policy.delay(n, rng) for n in (1, 2, 3, 4, 5) for _ in range(20)]
    assert all(0 <= d <= 0.5 for d in delays)
    assert max(policy.delay(1, rng) for _ in range(50)) <= 0.1
    assert len(set(delays)) > 50
