"""Apps and replicas: which Spaces may answer a call that names no Space.

Spaces whose APIs are identical — every named endpoint with its parameters and outputs,
as ``view_api`` describes them — are replicas of one app; ``POOL_SPACES`` may also name
the group of a Space explicitly (``alias@app=URL``). An implicit app is called after
its first configured Space. A call without ``space`` is routed among the Spaces that
have its ``api_name``; when those disagree on what the endpoint is, it is
:class:`~pool.AmbiguousEndpoint`, raised before any slot is taken:

* two Spaces of different explicit apps both have it, or
* two Spaces without an explicit app have it with different parameters or outputs.

Spaces of different apps whose endpoint is identical (a shared ``/echo`` taking and
returning the same things) still share the call, as before apps existed.

A Space's API is known once a connection to it opened (``SpacePool.signatures``). A
call without ``space`` first connects to the Spaces not known yet (no admission slot,
in parallel, bounded by ``POOL_CONNECT_TIMEOUT_S``); one that cannot be reached stays
unknown and routing deals with it as with any failing Space.

A user's pin is per app (:meth:`Apps.pin_key`): a user of two apps has one Space in each.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from .._exceptions import AmbiguousEndpoint, PoolClosedError, PoolError
from .._tasks import cancel_and_wait
from ..resilience import WAKING_STAGES

if TYPE_CHECKING:
    from .._spaces import SpaceSpec
    from ..connections import Failover, SpacePool


# ``Waker.stage``: the Space's stage as the Hub reports it (None: not known).
StageOf = Callable[["SpaceSpec"], Awaitable["str | None"]]


def _api_digest(signatures: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(signatures, sort_keys=True).encode()).hexdigest()[:16]


class Apps:
    """The apps of a pool's Spaces, from their explicit groups and known APIs."""

    def __init__(
        self, spaces: dict[str, SpacePool], discover_s: float, failover: Failover,
        stage_of: StageOf,
    ) -> None:  # fmt: skip
        self._spaces = spaces
        self._discover_s = discover_s
        self._failover = failover
        self._stage_of = stage_of

    def app_of(self, name: str) -> str | None:
        """The app of Space ``name``: its explicit group, else the first configured
        Space with the same API; None while its API is not known."""
        sp = self._spaces[name]
        if sp.spec.app is not None:
            return sp.spec.app
        if sp.signatures is None:
            return None
        digest = _api_digest(sp.signatures)
        for other in self._spaces.values():
            if (other.spec.app is None and other.signatures is not None
                    and _api_digest(other.signatures) == digest):  # fmt: skip
                return other.name
        return name

    def apps(self) -> dict[str, list[str]]:
        """Every known app and its replicas (Spaces whose API is unknown are left out)."""
        found: dict[str, list[str]] = {}
        for name in self._spaces:
            app = self.app_of(name)
            if app is not None:
                found.setdefault(app, []).append(name)
        return found

    def _serving(self, api_name: str) -> dict[str, list[str]]:
        """Spaces known to have ``api_name``, by what the endpoint is there (the
        explicit app, or the endpoint's own signature)."""
        kinds: dict[str, list[str]] = {}
        for name, sp in self._spaces.items():
            if sp.signatures is None or api_name not in sp.signatures:
                continue
            key = f"app:{sp.spec.app}" if sp.spec.app else f"sig:{sp.signatures[api_name]}"
            kinds.setdefault(key, []).append(name)
        return kinds

    async def check(self, api_name: str | None, admits: Callable[[str], bool]) -> None:
        """AmbiguousEndpoint if apps that disagree on ``api_name`` have it; Spaces not
        known yet (and not ruled out by ``admits``) are connected to first."""
        if api_name is None or len(self._spaces) < 2:
            return
        await self.discover(admits)
        kinds = self._serving(api_name)
        if len(kinds) > 1:
            apps: dict[str, list[str]] = {}
            for names in kinds.values():
                for name in names:
                    apps.setdefault(self.app_of(name) or name, []).append(name)
            raise AmbiguousEndpoint(api_name, apps)

    async def app_for(self, api_name: str, admits: Callable[[str], bool]) -> str | None:
        """The app whose endpoint ``api_name`` is (AmbiguousEndpoint as :meth:`check`);
        None when no Space known to the pool has it yet (one could not be reached)."""
        await self.check(api_name, admits)
        await self.discover(admits)
        serving = sorted(n for names in self._serving(api_name).values() for n in names)
        return self.app_of(serving[0]) if serving else None

    def endpoints(self, app: str) -> list[str] | None:
        """The named endpoints of ``app``'s replicas (None while none is known)."""
        known = [sp.api_names for n, sp in self._spaces.items()
                 if sp.api_names is not None and self.app_of(n) == app]  # fmt: skip
        return sorted(set().union(*known)) if known else None

    def pin_key(self, user: str | None, api_name: str | None) -> str | None:
        """What a user's pin is kept under: the user alone while the pool has one app
        (or the call's is not known), else the user in the call's app."""
        if user is None or api_name is None or len(self.apps()) <= 1:
            return user
        apps = {self.app_of(n) for names in self._serving(api_name).values() for n in names}
        if len(apps) != 1 or None in apps:
            return user
        return f"{user}@{apps.pop()}"

    async def discover(self, admits: Callable[[str], bool]) -> None:
        """Connect once to every Space whose API is not known yet (and that ``admits``
        allows), in parallel, bounded; no admission slot."""
        unknown = [sp for sp in self._spaces.values()
                   if sp.signatures is None and sp.is_up() and admits(sp.name)]  # fmt: skip
        if not unknown:
            return
        tasks = [asyncio.ensure_future(self._learn(sp)) for sp in unknown]
        try:
            await asyncio.wait(tasks, timeout=self._discover_s)
        finally:
            await cancel_and_wait(*tasks)

    async def _learn(self, sp: SpacePool) -> None:
        """Connect to ``sp`` once (its API becomes known). A Space that cannot be
        reached is reported like a failure before the call was placed, unless the Hub
        says it is asleep or starting: then it stays unknown, and the request routed
        to it wakes it (pool/resilience/_waking.py)."""
        try:
            conn = await sp.checkout()
        except PoolClosedError:
            return
        except PoolError as exc:
            stage = None
            with contextlib.suppress(Exception):
                stage = await self._stage_of(sp.spec)
            if stage not in WAKING_STAGES:
                self._failover.space_failed(sp, exc, placed=False)
            return
        sp.checkin(conn, discard=False)
