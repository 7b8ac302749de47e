"""One Space's health, shared by the fleet: adaptive window, breaker, wake and pause.

The record is a small JSON document kept in the coordinator's shared values and
changed only by the pure functions below, applied atomically by the store
(``SharedValues.update``): every process sees one window, one breaker and one
wake deadline per Space. Times are wall-clock seconds (``time.time()``), the only
clock several hosts share.

Window (AIMD, seed 004): start at ``initial``; +1 after ``grow_after`` successes in a
row; halve on a provider failure; floor 1; ceiling = min(Space max, resource cap,
logical limit). Caller errors and policy refusals are *neutral*: they move nothing.
The Space's own queue is a signal too: a call that waited behind another in it
(``congested``: -1) or a "Queue is full" (``refused``: halved) holds growth one below
the window it happened at for ``HOLD_S``, so the window settles at the Space's real
concurrency instead of piling calls into its queue (see docs/hub.md).

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
Outcome = Literal["success", "failure", "neutral", "congested", "refused"]
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
def record(h: SpaceHealth, outcome: Outcome, now: float, p: HealthParams) -> SpaceHealth:
    """The record after one finished request."""
    h = dataclasses.replace(h, last_active=now)
    if outcome == "congested":
        if h.breaker != "closed":  # served: the Space is alive (recovery as a success)
            return record(h, "success", now, p)
        # Waited behind others in the Space's queue: our calls exceed its concurrency.
        # Step back by one and hold growth there while the signal persists.
        window = max(1, h.window - 1)
        return dataclasses.replace(h, streak=0, failures=0, window=window,
                                   held_at=window, held_until=now + HOLD_S)  # fmt: skip
    if outcome == "refused":
        after = record(h, "failure", now, p)
        if after is h or after.breaker != "closed":
            return after  # booting (nothing moves), or the breaker decides now
        return dataclasses.replace(after, held_at=max(1, h.window - 1), held_until=now + HOLD_S)
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
        open_until=0.0, probe_until=0.0, last_active=now, held_until=0.0,
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
