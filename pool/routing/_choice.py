"""Which Space serves an attempt: the named one, or the caller's pin, or the next by
round robin / least load — among the Spaces up, with the endpoint, whose shared breaker
admits work or is due a half-open probe (SPEC 4.4, docs/scheduling.md).

A caller with no usable pin (anonymous, or a user not pinned yet) gets every replica
that may take it, best first: it waits for all of them at once and the first to free a
slot serves it (late binding, issue 31, pool/_attempt.py); a user is pinned where its
first call was admitted, fleet-wide (:meth:`Router.claim <pool.routing._routing.Router.claim>`).

:class:`Choice` is given the narrow things it reads (the Spaces' local pools, the shared
health board, the apps, the pins) and decides; it never calls back into the pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from .._clock import Clock
from .._events import Hook, PoolEvent, emit
from .._exceptions import NoHealthySpaceError, PoolError, UnknownEndpoint
from ..admission import Changed
from ..connections import SpacePool
from ..resilience import HealthBoard
from ._apps import Apps
from ._routing import Router


@dataclass(frozen=True)
class Route:
    """Where an attempt may go: ``spaces`` best first (one when it is named, pinned or
    a probe), whether it is the half-open ``probe`` of that one Space, and the user's
    pin: its key (None: anonymous, or a named Space), the Space it named when routed
    (``pinned``) and the pin this attempt fails over from (``replacing``)."""

    spaces: list[str]
    probe: bool = False
    pin_key: str | None = None
    pinned: str | None = None

    @property
    def replacing(self) -> str | None:
        """The pinned Space when this route left it out (it could not take the call)."""
        return self.pinned if self.pinned is not None and self.pinned not in self.spaces else None


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
        app: str | None = None,
        pin_as: str | None = None,
    ) -> Route:
        """The Spaces this attempt may take, best first — up, breaker closed or ours to
        probe, not tried, with the endpoint (and of ``app`` when given: a session bound
        to an app) — and whether this request is the half-open probe of the one Space
        returned then. A named Space, a pinned user's Space or a probe is one Space;
        otherwise every replica that may serve it (late binding). ``pin_as``: the pin
        to follow and claim instead of the user's (an anonymous session's, until its
        first call pins it)."""
        if space is not None:
            name, probing = await self._pick_named(space, tried, last)
            return Route([name], probing)
        board = self._board
        # AmbiguousEndpoint, before any slot (Spaces the pool paused are not woken for it)
        await self._apps.check(
            api_name, lambda n: board.get(n).admits() and not board.get(n).paused
        )
        self._check_endpoint(api_name)
        key = pin_as or self._apps.pin_key(user, api_name)  # a pin per app
        pinned = await self._router.pinned(key) if key else None
        within = None if app is None else set(self._apps.apps().get(app, ()))
        while True:
            usable = [n for n in self._usable(tried, api_name) if within is None or n in within]
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
            if pinned is not None and pinned not in usable and not board.get(pinned).admits():
                emit(self._hooks, PoolEvent("failover", pinned, "breaker_open"))
            probes = [n for n in candidates if not board.get(n).admits()]
            if probes and not (pinned in candidates and board.get(pinned or "").admits()):
                if await board.take_probe(probes[0]):
                    return Route([probes[0]], True, key, pinned)  # recovery needs a probe
                tried.append(probes[0])
                continue
            closed = [n for n in candidates if board.get(n).admits()]
            names = self._router.order(key, pinned, closed, lambda n: self._spaces[n].load())
            return Route(names, False, key, pinned)

    async def claim(self, route: Route, space: str) -> str:
        """``space`` admitted a call of ``route``'s user: pin the user there unless a
        call of theirs was admitted elsewhere first (fleet-wide). Returns the pin."""
        assert route.pin_key is not None
        holder, made = await self._router.claim(route.pin_key, space, route.replacing)
        if made:
            emit(self._hooks, PoolEvent("assignment", space))
        return holder

    async def app_for(self, api_name: str) -> str | None:
        """The app a session that will call ``api_name`` is bound to (None: not known
        yet, its first call decides); UnknownEndpoint / AmbiguousEndpoint as a call."""
        board = self._board
        app = await self._apps.app_for(
            api_name, lambda n: board.get(n).admits() and not board.get(n).paused
        )
        if app is None:
            self._check_endpoint(api_name)
        return app

    def check_session_call(self, space: str | None, app: str | None, api_name: str) -> None:
        """UnknownEndpoint, naming the session's app and its endpoints, when a call of a
        session pinned to ``space`` (or bound to ``app``) names an endpoint it lacks."""
        if space is not None:
            app = self._apps.app_of(space) or space
            known = self._spaces[space].api_names
            available = None if known is None else sorted(known)
        elif app is not None:
            available = self._apps.endpoints(app)
        else:
            return
        if available is not None and api_name not in available:
            raise UnknownEndpoint(api_name, available, where=f"the session's app {app!r} has")

    def watch_pin(self, route: Route) -> AbstractAsyncContextManager[Changed]:
        """Wake-ups for each change of ``route``'s user's pin, fleet-wide."""
        assert route.pin_key is not None
        return self._router.watch(route.pin_key)

    async def pin_of(self, route: Route) -> str | None:
        """``route``'s user's pin now (None: not pinned)."""
        assert route.pin_key is not None
        return await self._router.pinned(route.pin_key)

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


__all__ = ["Choice", "Route"]
