"""The pure rules by which a window finds its Space's limit (issue 31,
pool/resilience/_health.py): ``at`` is how many of our calls were at the Space when the
call was sent, itself included."""

from __future__ import annotations

from pool.resilience import HealthParams, SpaceHealth
from pool.resilience._health import HOLD_S, record

P = HealthParams(initial=4, ceiling=50, grow_after=3, breaker_failures=5, cooldown_s=10)


def fresh() -> SpaceHealth:
    return SpaceHealth.loads(None, P, 0.0)


def test_prompt_starts_set_the_floor_once_confirmed_and_never_lower_it() -> None:
    """One reading is only sighted (two streams' messages crossing can make a count read
    high once); a second at least as high confirms it."""
    h = record(fresh(), "prompt", 1.0, P, at=3)
    assert (h.floor, h.sighted, h.window) == (0, 3, 4)
    h = record(h, "prompt", 1.0, P, at=2)
    assert (h.floor, h.sighted) == (2, 3), "2 is confirmed by the 3 before it"
    h = record(h, "prompt", 1.0, P, at=6)  # the third success in a row: +1, as any
    assert (h.floor, h.sighted, h.window) == (3, 6, 5)
    h = record(h, "prompt", 1.0, P, at=2)
    assert (h.floor, h.sighted) == (3, 6), "never lowered"
    h = record(h, "prompt", 1.0, P, at=6)
    assert (h.floor, h.sighted) == (6, 0)


def test_a_single_high_reading_holds_nothing() -> None:
    """The CI failure of issue 31: a Space that runs 2 (queue 1) read once as running 4
    kept its window at 4. Read once, 4 is no floor: calls that wait bring it to 2."""
    h = record(fresh(), "prompt", 1.0, P, at=4)
    h = record(h, "prompt", 1.0, P, at=2)
    assert (h.floor, h.sighted) == (2, 4)
    h = record(h, "congested", 2.0, P, at=3)
    assert (h.window, h.floor, h.sighted) == (2, 2, 0)
    h = record(h, "prompt", 2.0, P, at=3)  # a crossing again, once: sighted only
    assert (h.window, h.floor) == (2, 2)


def test_a_refusal_without_at_keeps_the_confirmed_floor() -> None:
    h = fresh()
    for _ in range(2):
        h = record(h, "prompt", 1.0, P, at=3)
    assert (h.floor, h.window) == (3, 4)
    h = record(h, "refused", 2.0, P)
    assert (h.window, h.held_at) == (3, 3), "halved to 2, but the Space ran 3"


def test_congestion_caps_the_window_below_the_calls_there() -> None:
    """At 3 calls one waited for a worker (the Space said all were busy): the Space runs
    2: window 2, growth held there."""
    h = record(fresh(), "congested", 1.0, P, at=3)
    assert (h.window, h.held_at, h.held_until, h.doubts) == (2, 2, 1.0 + HOLD_S, 0)
    for _ in range(9):
        h = record(h, "prompt", 2.0, P, at=2)
    assert (h.window, h.floor) == (2, 2), "held at the Space's concurrency"


def test_congestion_below_the_floor_is_a_race_once() -> None:
    """Three calls on a Space that runs 2 wait and start in turn (congested, prompt,
    congested, ...): each congested call brings the window to 2. Below a confirmed
    floor, one is a race; two in a row bring the floor down."""
    h = fresh()
    for _ in range(4):
        h = record(h, "congested", 1.0, P, at=3)
        h = record(h, "prompt", 1.0, P, at=2)
    assert (h.window, h.floor) == (2, 2)
    h = record(h, "congested", 2.0, P, at=2)
    assert (h.window, h.floor, h.doubts) == (2, 2, 1)
    h = record(h, "congested", 2.0, P, at=2)
    assert (h.window, h.floor, h.doubts) == (1, 1, 0)


def test_refusals_cap_at_the_calls_there_but_a_single_race_below_the_floor_moves_nothing() -> None:
    """Refused at 4 calls: the Space runs and queues at most 3 (window 3, held). With a
    floor of 2 (2 ran at once), a refusal at 2 is a race: nothing moves, once."""
    h = record(fresh(), "refused", 1.0, P, at=4)
    assert (h.window, h.held_at, h.failures) == (3, 3, 0), "our own load: not the breaker's"
    h = record(h, "prompt", 1.0, P, at=2)
    h = record(h, "prompt", 1.0, P, at=2)  # confirmed
    h = record(h, "refused", 2.0, P, at=2)
    assert (h.window, h.floor, h.doubts) == (3, 2, 1)
    h = record(h, "prompt", 2.0, P, at=2)  # the next call started at once: it was a race
    assert (h.window, h.floor, h.doubts) == (3, 2, 0)
    h = record(h, "refused", 3.0, P, at=2)
    h = record(h, "refused", 3.0, P, at=2)  # twice in a row: the Space has less room now
    assert (h.window, h.floor) == (1, 1)


def test_a_refusal_of_an_unpaced_join_holds_nothing_and_prompt_starts_bring_it_back() -> None:
    h = record(fresh(), "raced", 1.0, P, at=4)
    assert (h.window, h.failures, h.held_until) == (3, 0, 0.0)
    for _ in range(3):
        h = record(h, "prompt", 1.0, P, at=3)
    assert h.window == 4, "a race: growth was not held"
    for _ in range(5):
        h = record(h, "raced", 1.0, P, at=1)
    assert h.breaker == "open"


def test_refusals_count_toward_the_breaker_only_without_our_other_calls_there() -> None:
    """Queue-full answers while the window is still above the Space's room (others of our
    calls there) never open the breaker, however many; five with none of ours beside
    them (the Space is full for us) or not known (``at`` 0) do."""
    h = fresh()
    for _ in range(12):
        h = record(h, "refused", 1.0, P, at=3)
    assert (h.breaker, h.failures) == ("closed", 0)
    for at in (1, 0):
        h = fresh()
        for _ in range(P.breaker_failures):
            h = record(h, "refused", 1.0, P, at=at)
        assert h.breaker == "open", at


def test_without_at_the_old_steps_remain() -> None:
    h = record(fresh(), "congested", 1.0, P)
    assert (h.window, h.held_at) == (3, 3)
    h = record(fresh(), "refused", 1.0, P)
    assert (h.window, h.held_at) == (2, 3)
