"""One Space's health, shared by the fleet: adaptive window, breaker, wake and pause.

The record is a small JSON document kept in the coordinator's shared values and
changed only by the pure functions below, applied atomically by the store
(``SharedValues.update``): every process sees one window, one breaker and one
wake deadline per Space. Times are wall-clock seconds (``time.time()``), the only
clock several hosts share.

Window (AIMD, seed 004): start at ``initial``; +1 after ``grow_after`` successes in a
row; halve on a provider failure; floor 1; ceiling = min(Space max, resource cap,
logical limit). Caller errors and policy refusals are *neutral*: they move nothing.

The Space's own queue tells its limit (issue 31, docs/hub.md), measured at the Space
from its own messages, never from the pool's view of its calls. Each outcome may say how
many of our calls the Space held (``at``, itself included), each counted the way that
errs on the safe side for what it is used for (pool/connections/_pacing.py):

* ``prompt``: the Space had a worker free for it, and ``at`` of our calls ran there at
  once when it started, counted from the Space's own start and completion messages
  (pool/connections/_pacing.py): it runs at least ``at`` at once. A reading becomes the
  record's ``floor`` once confirmed: a second prompt start read at least as high (one
  reading alone is ``sighted``; a count may still read high once when two streams'
  messages cross). A success otherwise.
* ``congested``: it waited for a worker (the Space's last estimation before its start
  said every worker was busy), ``at`` the most of our calls sent and not ended from its
  join to its start: the Space runs fewer than ``at``: window ``at - 1`` at
  most, its growth held there for ``HOLD_S``. One that contradicts the floor is a race
  and moves nothing, once; twice in a row the floor comes down.
* ``refused`` ("Queue is full" to a paced join; ``at`` as for a wait): the Space runs
  and queues fewer than ``at``: window ``at - 1`` at most (and at most halved, never below the floor
  without ``at``), held there; a provider failure for the breaker only when none of our
  other calls were there (``at`` ≤ 1: :func:`_refusal`). One that contradicts
  the floor (``at - 1`` below it) is a race and moves nothing, once; twice in a row
  the floor comes down (another client's load).
* ``raced``: "Queue is full" to a join sent before the Space's joins were paced (two
  joins within one poll of its queue overflow ``max_size=1`` with workers free,
  pool/connections/_pacing.py): maybe the limit, maybe a race: the window comes down as
  for a refusal but not below the floor, and its growth is not held.

So the window settles at the Space's real concurrency, at most its concurrency plus its
queue, and each Space of an app learns its own. Without ``at`` (0: not known) a
congested call steps the window back by one and a refusal halves it, as before.

Breaker states, one line each::

    closed     normal; opens after ``breaker_failures`` provider failures in a row
    open       refuses new work until ``open_until`` (the cool-down)
    half_open  one probe is let through (held until ``probe_until``); its success
               closes the breaker with the window restarted at 1, its failure reopens

Wake (seed 002): ``wake_until`` > now means the Space is booting; until then its
failures count against nothing, and the fleet waits for it instead of failing over.
``paused`` marks a Space the pool paused itself (idle pause); a request restarts it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Literal

BreakerState = Literal["closed", "open", "half_open"]
# congested: served, but only after waiting behind others in the Space's own queue;
# refused: a provider failure that says the Space's queue is full ("Queue is full").
# prompt: served, and the Space had a worker free for it when it joined; raced: "Queue
# is full" to a join sent while others were joining (pool/connections/_pacing.py).
Outcome = Literal[
    "success", "failure", "neutral", "congested", "refused", "prompt", "raced"
]
HOLD_S = 60.0  # how long a growth hold lasts after the Space's queue pushed back


@dataclass(frozen=True)
class HealthParams:
    """The knobs of one Space's window and breaker."""

    initial: int = 4
    ceiling: int = 50
    grow_after: int = 3
    breaker_failures: int = 5
    cooldown_s: float = 30.0
    probe_timeout_s: float = 60.0


@dataclass(frozen=True)
class SpaceHealth:
    """The shared record (see the module docstring)."""

    window: int
    initial: int
    peak: int
    ceiling: int
    streak: int = 0
    failures: int = 0
    breaker: BreakerState = "closed"
    open_until: float = 0.0
    probe_until: float = 0.0
    transitions: int = 0
    wake_until: float = 0.0
    woke_at: float = 0.0
    paused: bool = False
    last_active: float = 0.0
    # The Space's own queue pushed back (congested/refused): the window may not grow
    # above ``held_at`` until ``held_until``; a closing breaker or a wake lifts it.
    held_at: int = 0
    held_until: float = 0.0
    # The most of our calls the Space has run at once with a worker free for the last
    # (``prompt``), confirmed by a second such reading; and how many congested/refused
    # calls in a row contradicted it.
    floor: int = 0
    doubts: int = 0
    # The highest prompt reading above the floor, seen once (not yet confirmed).
    sighted: int = 0

    # -- predicates ---------------------------------------------------------------------
    def waking(self, now: float) -> bool:
        return now < self.wake_until

    def admits(self) -> bool:
        """New work may go here now without taking the probe (closed breaker)."""
        return self.breaker == "closed"

    def probe_due(self, now: float) -> bool:
        """The cool-down is over and nobody holds a live probe."""
        if self.breaker == "open":
            return now >= self.open_until
        return self.breaker == "half_open" and now >= self.probe_until

    def held(self, now: float) -> bool:
        """Growth is held at ``held_at`` (the Space's queue pushed back lately)."""
        return now < self.held_until

    def growth_limit(self, now: float) -> int:
        return min(self.ceiling, self.held_at) if self.held(now) else self.ceiling

    def retry_after(self, now: float) -> float:
        """Seconds until this Space may take work again (0 if it may now)."""
        if self.breaker == "open":
            return max(0.0, self.open_until - now)
        if self.breaker == "half_open":
            return max(0.0, self.probe_until - now)
        return 0.0

    # -- (de)serialisation --------------------------------------------------------------
    def dumps(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def loads(cls, raw: str | None, params: HealthParams, now: float) -> SpaceHealth:
        """The stored record, or a fresh one (window at ``initial``, awake since now)."""
        if raw:
            try:
                data = json.loads(raw)
                fields = {f.name for f in dataclasses.fields(cls)}
                health = cls(**{k: v for k, v in data.items() if k in fields})
            except (ValueError, TypeError):
                health = None
            if health is not None:
                return health.retuned(params)
        start = min(params.initial, params.ceiling)
        return cls(window=start, initial=start, peak=start, ceiling=params.ceiling, woke_at=now)

    def retuned(self, params: HealthParams) -> SpaceHealth:
        """Apply this process's ceiling (settings may differ between deploys)."""
        if params.ceiling == self.ceiling:
            return self
        return dataclasses.replace(
            self, ceiling=params.ceiling, window=max(1, min(self.window, params.ceiling))
        )


# -- transitions: pure, no I/O -------------------------------------------------------------
def record(
    h: SpaceHealth, outcome: Outcome, now: float, p: HealthParams, at: int = 0
) -> SpaceHealth:
    """The record after one finished request; ``at``: our calls the Space held, itself
    included, as the module docstring says for each outcome (0: not known)."""
    h = dataclasses.replace(h, last_active=now)
    if outcome == "prompt":
        after = record(h, "success", now, p)
        if after.breaker != "closed" or at <= 0:
            return after
        # Confirmed by two readings: the floor rises to the lower of this one and the
        # highest seen before; the higher waits for its second.
        reading = min(at, after.ceiling)
        floor = max(after.floor, min(reading, after.sighted))
        top = max(reading, after.sighted)
        return dataclasses.replace(after, floor=floor, sighted=top if top > floor else 0,
                                   doubts=0)  # fmt: skip
    if outcome == "congested":
        if h.breaker != "closed":  # served: the Space is alive (recovery as a success)
            return record(h, "success", now, p)
        # Waited for a worker (the Space said every one was busy): our calls exceed its
        # concurrency. Step back below them and hold growth there — unless that
        # contradicts the floor, once (a race: another client's event, an event that
        # overran its average).
        h = dataclasses.replace(h, streak=0, failures=0)
        if at <= 0:
            return _pushed_back(h, max(1, h.window - 1), now, sure=True)
        return _pushed_back(h, max(1, at - 1), now)
    if outcome == "raced":
        after = _refusal(h, now, p, at)
        if after is h or after.breaker != "closed":
            return after
        # Maybe the limit, maybe a burst's race: down as a refusal, never below the
        # floor, growth not held (prompt starts bring it back at once if it was a race).
        cap = max(1, h.window // 2, at - 1) if at > 0 else max(1, h.window // 2)
        return dataclasses.replace(after, window=max(min(h.window, cap), min(h.floor, h.window)))
    if outcome == "refused":
        after = _refusal(h, now, p, at)
        if after is h or after.breaker != "closed":
            return after  # booting (nothing moves), or the breaker decides now
        if at <= 0:  # halved, but not below what the Space showed it runs
            window = max(after.window, min(h.floor, h.window))
            return dataclasses.replace(after, window=window, held_at=max(1, h.window - 1),
                                       held_until=now + HOLD_S)  # fmt: skip
        # at most halved: a refusal at a low ``at`` is another client's load more often
        cap = max(1, h.window // 2, at - 1)
        return _pushed_back(dataclasses.replace(after, window=h.window), cap, now)
    if outcome == "neutral":
        # The Space answered (or nothing was sent): no signal about its capacity, but a
        # probe held for it is done.
        return dataclasses.replace(h, probe_until=0.0) if h.breaker == "half_open" else h
    if outcome == "success":
        if h.breaker != "closed":
            return dataclasses.replace(
                h, breaker="closed", window=1, streak=0, failures=0,
                probe_until=0.0, transitions=h.transitions + 1, held_until=0.0,
            )  # fmt: skip
        streak, window = h.streak + 1, h.window
        if streak >= p.grow_after:
            streak, window = 0, max(window, min(window + 1, h.growth_limit(now)))
        return dataclasses.replace(
            h, streak=streak, failures=0, window=window, peak=max(h.peak, window)
        )
    if h.waking(now):
        return h  # a booting Space is not failing: its wake deadline decides
    failures = h.failures + 1
    h = dataclasses.replace(h, streak=0, failures=failures, window=max(1, h.window // 2))
    if h.breaker == "half_open" or (h.breaker == "closed" and failures >= p.breaker_failures):
        return dataclasses.replace(
            h, breaker="open", open_until=now + p.cooldown_s, probe_until=0.0,
            transitions=h.transitions + 1,
        )  # fmt: skip
    return h


def _refusal(h: SpaceHealth, now: float, p: HealthParams, at: int) -> SpaceHealth:
    """A "Queue is full": the window halved, and a provider failure for the breaker —
    unless others of our calls were at the Space (``at`` ≥ 2): then our own load explains
    it, which is the window's business, not the Space's health (as Envoy keeps overflow
    apart from outlier detection). A refusal with none of ours beside it says the Space
    is full for us: five in a row open the breaker, and the app's calls go elsewhere."""
    if at >= 2 and h.breaker == "closed" and not h.waking(now):
        return dataclasses.replace(h, streak=0, window=max(1, h.window // 2))
    return record(h, "failure", now, p)


def _pushed_back(h: SpaceHealth, cap: int, now: float, *, sure: bool = False) -> SpaceHealth:
    """The Space's queue said it takes fewer than ``cap + 1`` of our calls: window at
    most ``cap``, growth held there — unless that contradicts the floor for the first
    time in a row (a race: nothing moves; ``sure``: it was the second already)."""
    floor, doubts = h.floor, 0
    if cap < floor:
        if h.doubts < 1 and not sure:
            return dataclasses.replace(h, doubts=h.doubts + 1)
        floor = cap  # twice in a row: the Space has less room now
    window = min(h.window, cap)
    sighted = h.sighted if h.sighted <= cap else 0  # a reading above the limit: a crossing
    return dataclasses.replace(h, window=window, floor=floor, doubts=doubts, held_at=window,
                               held_until=now + HOLD_S, sighted=sighted)  # fmt: skip


def take_probe(h: SpaceHealth, now: float, p: HealthParams) -> SpaceHealth | None:
    """Half-open the breaker for one probe; None if no probe is due."""
    if not h.probe_due(now):
        return None
    transitions = h.transitions + (1 if h.breaker == "open" else 0)
    return dataclasses.replace(
        h, breaker="half_open", probe_until=now + p.probe_timeout_s, transitions=transitions
    )


def begin_wake(h: SpaceHealth, now: float, deadline_s: float) -> SpaceHealth:
    """The Space is booting: hold failover off until ``now + deadline_s`` (kept if set)."""
    if h.waking(now):
        return h
    return dataclasses.replace(h, wake_until=now + deadline_s, paused=False)


def end_wake(h: SpaceHealth, now: float) -> SpaceHealth:
    """The Space answers: awake since now, breaker and window start afresh."""
    return dataclasses.replace(
        h, wake_until=0.0, woke_at=now, paused=False, failures=0, breaker="closed",
        open_until=0.0, probe_until=0.0, last_active=now, held_until=0.0, floor=0, doubts=0,
        sighted=0,
    )  # fmt: skip


def give_up_wake(h: SpaceHealth, now: float) -> SpaceHealth:
    """The wake deadline passed: normal failover applies from now on."""
    return dataclasses.replace(h, wake_until=min(h.wake_until, now))


def may_pause(h: SpaceHealth, now: float, idle_s: float, min_uptime_s: float) -> bool:
    """Idle long enough, up long enough, and not booting or paused already."""
    return (
        not h.paused
        and not h.waking(now)
        and now - max(h.last_active, h.woke_at) >= idle_s
        and now - h.woke_at >= min_uptime_s
    )


def mark_paused(h: SpaceHealth) -> SpaceHealth:
    return dataclasses.replace(h, paused=True)


def unmark_paused(h: SpaceHealth) -> SpaceHealth:
    return dataclasses.replace(h, paused=False)
