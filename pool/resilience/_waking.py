"""Sleeping Spaces: wake on demand within a deadline; pause idle ones (seed 002).

A request routed to a Space with no live connection first asks :class:`SpaceControl`
for its stage (cached a few seconds, one question at a time per Space):

* RUNNING or unknown: go ahead, the pool's own connect/probe logic applies;
* SLEEPING / starting / building: wake it, write a *wake deadline* into the shared
  record, and wait — without holding any admission slot — until the Space answers its
  cheap probe (then it is awake) or the deadline passes (then the request fails over,
  ``kind="wake_timeout"``). Until the deadline, breakers, health checks and failover
  leave the Space alone, in every process, and jobs show stage ``waking``;
* PAUSED by someone else or in an error stage: skip it at once (``kind="paused"`` or
  ``"space_error"``). A Space the pool paused itself is restarted and woken instead.

Idle pause, for the Spaces the operator lists: after ``idle_s`` without work, never
within ``min_uptime_s`` of a wake, one process claims the pause in the shared record
(deregistration first: no process routes new work to it any more), closes its idle
connections and then asks the Hub to pause it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from .._clock import SYSTEM_CLOCK, Clock
from .._events import Hook, PoolEvent, emit
from .._exceptions import DeadlineExceeded, UpstreamTransportError
from .._spaces import SpaceSpec
from ..admission import WaitTicket
from ._board import HealthBoard
from ._control import DOWN_STAGES, RUNNING, WAKING_STAGES, SpaceControl
from ._health import (
    SpaceHealth,
    begin_wake,
    end_wake,
    give_up_wake,
    mark_paused,
    may_pause,
    unmark_paused,
)

_log = logging.getLogger("spacepool")
_STAGE_TTL_S = 5.0


@dataclass(frozen=True)
class WakePolicy:
    deadline_s: float = 120.0
    poll_s: float = 1.0
    idle_pause_s: float = 0.0  # 0: never pause
    min_uptime_s: float = 600.0
    pause_spaces: frozenset[str] = frozenset()  # names; "*" = every Space

    def pauses(self, name: str) -> bool:
        return self.idle_pause_s > 0 and ("*" in self.pause_spaces or name in self.pause_spaces)


class Waker:
    """Wakes Spaces for requests and pauses idle ones, through one SpaceControl."""

    def __init__(
        self,
        control: SpaceControl,
        board: HealthBoard,
        policy: WakePolicy,
        hooks: list[Hook],
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.control = control
        self.board = board
        self.policy = policy
        self._hooks = hooks
        self._clock = clock
        self._stages: dict[str, tuple[str | None, float]] = {}
        self._asking: dict[str, asyncio.Future[str | None]] = {}

    def cached_stage(self, name: str) -> str | None:
        """The last stage seen (no I/O), None if never asked or unknown."""
        cached = self._stages.get(name)
        return None if cached is None else cached[0]

    async def stage(self, spec: SpaceSpec, *, fresh: bool = False) -> str | None:
        """The Space's stage, cached for a few seconds; concurrent askers share one call."""
        cached = self._stages.get(spec.name)
        if not fresh and cached is not None and self._clock.now() - cached[1] < _STAGE_TTL_S:
            return cached[0]
        pending = self._asking.get(spec.name)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._asking[spec.name] = future
        try:
            stage = await self.control.stage(spec)
        except Exception:
            stage = None
        finally:
            del self._asking[spec.name]
        self._stages[spec.name] = (stage, self._clock.now())
        future.set_result(stage)
        return stage

    async def ensure_awake(
        self,
        spec: SpaceSpec,
        *,
        connected: bool,
        probe_url: str | None,
        http: httpx.AsyncClient | None,
        ticket: WaitTicket | None,
        give_up_at: float | None = None,
    ) -> None:
        """Return when ``spec`` can take the request; raise to fail it over.

        Whether a waking Space serves yet: its ``app_id`` route at ``probe_url``
        (through ``http``), else the Hub's stage. ``give_up_at`` (this pool's clock) is
        the request's own deadline: waiting past it raises :class:`DeadlineExceeded`
        (the wake itself goes on for others).
        """
        name = spec.name
        health = self.board.get(name)
        now = self.board.now()
        if not health.waking(now) and not health.paused:
            if connected:
                return
            stage = await self.stage(spec)
            if stage is None or stage == RUNNING:
                return
            if stage in DOWN_STAGES:
                kind = "paused" if stage in {"PAUSED", "STOPPED"} else "space_error"
                raise UpstreamTransportError(
                    f"the Space is {stage.lower()}", kind=kind, before_accept=True
                )
            if stage not in WAKING_STAGES:
                return
        await self._wait_awake(spec, functools.partial(self._answers, spec, probe_url, http),
                               ticket, give_up_at)  # fmt: skip

    async def _answers(
        self, spec: SpaceSpec, probe_url: str | None, http: httpx.AsyncClient | None
    ) -> bool:
        """Whether a booting Space serves now: its app_id route, or the Hub's stage."""
        async with self._clock.timeout(None):  # real I/O, bounded by httpx / the Hub call
            if probe_url is not None and http is not None:
                return await http_probe(http, probe_url)
            return await self.stage(spec, fresh=True) == RUNNING

    async def _wait_awake(
        self,
        spec: SpaceSpec,
        probe: Callable[[], Awaitable[bool]],
        ticket: WaitTicket | None,
        give_up_at: float | None,
    ) -> None:
        name = spec.name
        deadline_s = self.policy.deadline_s
        began: list[bool] = []  # [restart?] when this call starts the wake

        def start(h: SpaceHealth, now: float) -> SpaceHealth:
            began.clear()  # the store may run this more than once
            if not h.waking(now):
                began.append(h.paused)
            return begin_wake(h, now, deadline_s)

        health = await self.board.update(name, start)
        started = self._clock.now()
        if began:
            # We began this wake: ask the Hub (a restart if we paused it). Others wait.
            restart = began[0]
            emit(self._hooks, PoolEvent("wake", name, "started"))
            _log.info("waking space %s (deadline %.0fs)", name, deadline_s)
            try:
                await self.control.wake(spec, restart=restart)
            except Exception as exc:
                _log.warning("space %s: wake request failed (%s)", name, type(exc).__name__)
        if ticket is not None:
            ticket.update(stage="waking", space=name)
        try:
            while self.board.now() < health.wake_until:
                if await probe():
                    await self.board.update(name, lambda h, now: end_wake(h, now))
                    emit(self._hooks, PoolEvent("wake", name, "awake", self._clock.now() - started))
                    self._stages[name] = (RUNNING, self._clock.now())
                    return
                if give_up_at is not None and self._clock.now() >= give_up_at:
                    raise DeadlineExceeded(
                        f"the deadline passed while {name} was waking up"
                    )
                pause = self.policy.poll_s
                if give_up_at is not None:
                    pause = min(pause, max(0.0, give_up_at - self._clock.now()))
                await self._clock.sleep(pause)
                health = self.board.get(name)
                if health.wake_until == 0.0:
                    # Another process saw it wake up (end_wake clears the deadline): it
                    # runs, so a later request here must not trust a cached SLEEPING.
                    self._stages[name] = (RUNNING, self._clock.now())
                    return
            await self.board.update(name, lambda h, now: give_up_wake(h, now))
            emit(self._hooks, PoolEvent("wake", name, "timeout", self._clock.now() - started))
            raise UpstreamTransportError(
                f"the Space did not wake up within {deadline_s:.0f}s",
                kind="wake_timeout",
                before_accept=True,
            )
        finally:
            if ticket is not None and ticket.stage == "waking":
                ticket.update(stage="queued")

    # -- idle pause ---------------------------------------------------------------------------
    async def claim_pause(self, spec: SpaceSpec) -> bool:
        r"""Claim the idle pause of ``spec`` in the shared record, if it qualifies (idle
        long enough, not within its minimum uptime) and we win the claim: from then on
        no process routes new work to it. True: ours; the caller, having checked that no
        work was admitted in between, closes its idle connections and :meth:`pause`\ s
        it, or hands the claim back (:meth:`unclaim_pause`)."""
        p = self.policy
        if not self.may_claim_pause(spec):
            return False
        won: list[bool] = []

        def claim(h: SpaceHealth, now: float) -> SpaceHealth | None:
            ok = may_pause(h, now, p.idle_pause_s, p.min_uptime_s)
            won[:] = [ok]
            return mark_paused(h) if ok else None

        await self.board.update(spec.name, claim)
        return bool(won and won[0])

    def may_claim_pause(self, spec: SpaceSpec) -> bool:
        """Whether ``spec`` qualifies for the idle pause now (no I/O; see
        :meth:`claim_pause`)."""
        p = self.policy
        return p.pauses(spec.name) and may_pause(
            self.board.get(spec.name), self.board.now(), p.idle_pause_s, p.min_uptime_s
        )

    async def unclaim_pause(self, spec: SpaceSpec) -> None:
        """Hand back a claim of :meth:`claim_pause` (work was admitted meanwhile)."""
        await self.board.update(spec.name, lambda h, _now: unmark_paused(h))

    async def pause(self, spec: SpaceSpec) -> bool:
        """Ask the Hub to pause ``spec``, whose pause we claimed; True if it did."""
        name = spec.name
        try:
            await self.control.pause(spec)
        except Exception as exc:
            _log.warning("space %s: pause failed (%s)", name, type(exc).__name__)
            emit(self._hooks, PoolEvent("pause", name, "failed"))
            return False
        self._stages[name] = ("PAUSED", self._clock.now())
        _log.info("paused idle space %s", name)
        emit(self._hooks, PoolEvent("pause", name, "paused"))
        return True


async def http_probe(http: httpx.AsyncClient, url: str) -> bool:
    """True if the Gradio app at ``url`` answers its ``app_id`` route."""
    try:
        response = await http.get(url, timeout=5.0)
    except httpx.HTTPError:
        return False
    return response.status_code == 200
