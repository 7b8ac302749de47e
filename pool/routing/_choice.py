"""Which Space serves an attempt: the named one, or the caller's pin, or the next by
round robin / least load — among the Spaces up, with the endpoint, whose shared breaker
admits work or is due a half-open probe (SPEC 4.4, docs/scheduling.md).

A caller with no usable pin (anonymous, or a user not pinned yet) gets every replica
that may take it, best first: it waits for all of them at once and the first to free a
slot serves it (late binding, issue 31, pool/_attempt.py); a user is pinned where it
was admitted (:meth:`Choice.assign`).

:class:`Choice` is given the narrow things it reads (the Spaces' local pools, the shared
health board, the apps, the pins) and decides; it never calls back into the pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .._clock import Clock
from .._events import Hook, PoolEvent, emit
from .._exceptions import NoHealthySpaceError, PoolError, UnknownEndpoint
from ..connections._space_pool import SpacePool
from ..resilience import HealthBoard
from ._apps import Apps
from ._routing import Router


class Choice:
    """Picks the Space of each attempt (see the module docstring)."""

    def __init__(
        self, *, spaces: Mapping[str, SpacePool], board: HealthBoard, apps: Apps,
        router: Router, hooks: list[Hook], clock: Clock,
    ) -> None:  # fmt: skip
        self._spaces = spaces
        self._board = board
        self._apps = apps
        self._router = router
        self._hooks = hooks
        self._clock = clock

    async def pick(
        self,
        user: str | None,
        space: str | None,
        tried: list[str],
        last: PoolError | None,
        avoid: Sequence[str],
        api_name: str | None = None,
    ) -> tuple[list[str], bool]:
        """The Spaces this attempt may take, best first — up, breaker closed or ours to
        probe, not tried, with the endpoint — and whether this request is the half-open
        probe of the one Space returned then. A named Space, a pinned user's Space or a
        probe is one Space; otherwise every replica that may serve it (late binding)."""
        if space is not None:
            name, probing = await self._pick_named(space, tried, last)
            return [name], probing
        board = self._board
        # AmbiguousEndpoint, before any slot (Spaces the pool paused are not woken for it)
        await self._apps.check(
            api_name, lambda n: board.get(n).admits() and not board.get(n).paused
        )
        self._check_endpoint(api_name)
        user = self._apps.pin_key(user, api_name)  # a pin per app
        while True:
            usable = self._usable(tried, api_name)
            if not usable:
                raise NoHealthySpaceError(
                    "every Space failed, is unhealthy or has its breaker open"
                    + self._which(tried, last),
                    retry_after_s=self.retry_after_down(),
                )
            # Prefer Spaces that are awake and not just failed for this request; a Space
            # the pool paused itself only when nothing else can serve.
            preferred = [n for n in usable if not board.get(n).paused and n not in avoid]
            candidates = preferred or [n for n in usable if not board.get(n).paused] or usable
            pinned = self._router.pinned(user) if user else None
            if pinned is not None and pinned not in usable and not board.get(pinned).admits():
                emit(self._hooks, PoolEvent("failover", pinned, "breaker_open"))
            probes = [n for n in candidates if not board.get(n).admits()]
            if probes and not (pinned in candidates and board.get(pinned or "").admits()):
                if await board.take_probe(probes[0]):
                    return [probes[0]], True  # recovery needs a probe: this request is it
                tried.append(probes[0])
                continue
            closed = [n for n in candidates if board.get(n).admits()]
            return self._router.order(user, closed, lambda n: self._spaces[n].load()), False

    def assign(self, user: str, space: str) -> None:
        """``user`` (a pin key) was admitted on ``space``: pinned there from now on."""
        if self._router.pinned(user) != space:
            self._router.repin(user, space)
            emit(self._hooks, PoolEvent("assignment", space))

    def _which(self, tried: list[str], last: PoolError | None) -> str:
        """The Spaces behind a NoHealthySpaceError, by name: the last failure and where,
        the ones this request tried, the ones down (no URL: it may carry a secret)."""
        failed = list(dict.fromkeys(tried))
        down = [n for n, sp in self._spaces.items() if n not in failed and not sp.is_up()]
        parts = []
        if last is not None:
            parts.append(f"last failure: {last.kind}" + (f" on {failed[-1]}" if failed else ""))
        if failed:
            parts.append(f"tried: {', '.join(failed)}")
        if down:
            parts.append(f"down: {', '.join(down)}")
        return f"; {'; '.join(parts)}" if parts else ""

    def _usable(self, tried: list[str], api_name: str | None) -> list[str]:
        now = self._clock.wall()
        return [
            n
            for n, sp in self._spaces.items()
            if sp.is_up()
            and n not in tried
            and sp.may_serve(api_name)
            and (self._board.get(n).admits() or self._board.get(n).probe_due(now))
        ]

    def for_session(self, user: str | None) -> str:
        """The Space a new session goes to: the user's pin, else round robin among the
        Spaces up whose breaker admits work, least loaded first."""
        usable = [n for n, sp in self._spaces.items()
                  if sp.is_up() and self._board.get(n).admits()]  # fmt: skip
        return self._router.candidates(user, usable, lambda n: self._spaces[n].load())[0]

    async def _pick_named(
        self, space: str, tried: list[str], last: PoolError | None
    ) -> tuple[str, bool]:
        """A request for one Space: it, or its half-open probe, else NoHealthySpaceError."""
        if tried:
            raise NoHealthySpaceError(
                f"Space {space!r} failed ({last.kind if last else '?'})",
                retry_after_s=self.retry_after_down(),
            )
        health = self._board.get(space)
        if health.admits():
            return space, False
        if await self._board.take_probe(space):
            return space, True
        emit(self._hooks, PoolEvent("failover", space, "breaker_open"))
        raise NoHealthySpaceError(
            f"Space {space!r} is refusing work for now (circuit breaker open)",
            retry_after_s=max(1.0, health.retry_after(self._clock.wall())),
        )

    def _check_endpoint(self, api_name: str | None) -> None:
        """UnknownEndpoint if every Space's API is known and none has ``api_name``."""
        if any(sp.may_serve(api_name) for sp in self._spaces.values()):
            return
        known = sorted(set().union(*(sp.api_names or () for sp in self._spaces.values())))
        raise UnknownEndpoint(str(api_name), known, where="the pool's Spaces have")

    def retry_after_down(self) -> float:
        """Seconds until the first Space marked down or breaker-open may be tried again."""
        now, wall = self._clock.now(), self._clock.wall()
        waits = [sp.down_until - now for sp in self._spaces.values() if sp.down_until > now]
        waits += [w for n in self._spaces if (w := self._board.get(n).retry_after(wall)) > 0]
        return round(max(1.0, min(waits)), 1) if waits else 1.0


__all__ = ["Choice"]
