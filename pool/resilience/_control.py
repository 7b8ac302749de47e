"""``SpaceControl``: the little of the Hub's API the pool needs, behind one interface.

A Hub Space sleeps when idle, takes tens of seconds to wake, and may be paused by its
owner. The pool asks three things: what stage is the Space in, wake it (a request to
its host is enough), pause it (idle pause, for Spaces the operator owns). The Hub is
unreachable from the test machines, so :class:`FakeSpaceControl` stands in for it
there; :class:`HubSpaceControl` is the real one, over ``huggingface_hub``.

Stages are the Hub's strings (``SpaceRuntime.stage``); ``None`` means "not managed
here" (a plain URL, or the Hub could not be asked): the pool then relies on its own
probes, as for any backend.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Protocol, TypeVar

import httpx

from .._clock import SYSTEM_CLOCK, Clock
from .._spaces import SpaceSpec

# Booting: wait for it (within the wake deadline) instead of failing over.
WAKING_STAGES = frozenset(
    {"SLEEPING", "APP_STARTING", "BUILDING", "RUNNING_BUILDING", "RUNNING_APP_STARTING"}
)
# Will not serve until a human acts: skip it at once.
DOWN_STAGES = frozenset(
    {"PAUSED", "STOPPED", "NO_APP_FILE", "CONFIG_ERROR", "BUILD_ERROR", "RUNTIME_ERROR",
     "DELETING"}
)  # fmt: skip
RUNNING = "RUNNING"
T = TypeVar("T")


class SpaceControl(Protocol):
    """What the pool asks of the Hub about one Space."""

    async def stage(self, spec: SpaceSpec) -> str | None:
        """The Space's runtime stage (``"RUNNING"``, ``"SLEEPING"``, …), None if unknown."""
        ...

    async def wake(self, spec: SpaceSpec, *, restart: bool = False) -> None:
        """Ask a sleeping Space to start; ``restart`` for one the pool paused itself
        (a paused Space only starts again through a restart)."""
        ...

    async def pause(self, spec: SpaceSpec) -> None:
        """Pause the Space (owner only)."""
        ...


def _repo_id(spec: SpaceSpec) -> str | None:
    return None if spec.src.startswith(("http://", "https://")) else spec.src


class HubSpaceControl:
    """:class:`SpaceControl` over ``huggingface_hub.HfApi`` (blocking calls in threads)."""

    def __init__(
        self,
        token: str | None,
        *,
        timeout_s: float = 10.0,
        executor: Executor | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._token = token
        self._timeout_s = timeout_s
        self._clock = clock
        # The pool passes its own executor, so that no call leaves a thread in the
        # loop's default executor (None) once the pool is closed.
        self._executor = executor
        self._api: object | None = None
        self._hosts: dict[str, str] = {}
        self._lock = threading.Lock()

    def _hf(self) -> object:
        with self._lock:
            if self._api is None:
                from huggingface_hub import HfApi

                self._api = HfApi(token=self._token or False)
            return self._api

    async def _blocking(self, call: Callable[[], T]) -> T:
        """``call()`` in the executor, within the timeout."""
        future = asyncio.get_running_loop().run_in_executor(self._executor, call)
        async with self._clock.timeout(self._timeout_s):
            return await future

    async def stage(self, spec: SpaceSpec) -> str | None:
        repo = _repo_id(spec)
        if repo is None:
            return None

        def ask() -> str | None:
            runtime = self._hf().get_space_runtime(repo)  # type: ignore[attr-defined]
            return str(runtime.stage) if runtime.stage else None

        try:
            return await self._blocking(ask)
        except Exception:  # the Hub is down or refuses: we do not know
            return None

    async def wake(self, spec: SpaceSpec, *, restart: bool = False) -> None:
        repo = _repo_id(spec)
        if repo is None:
            return
        if restart:
            await self._blocking(
                lambda: self._hf().restart_space(repo)  # type: ignore[attr-defined]
            )
            return
        host = self._hosts.get(repo)
        if host is None:

            def info() -> str:
                found = self._hf().space_info(repo)  # type: ignore[attr-defined]
                return str(found.host or "")

            try:
                host = await self._blocking(info)
            except Exception:
                return
            self._hosts[repo] = host
        if not host:
            return
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        try:  # any request to the Space's host starts it; the answer does not matter
            async with httpx.AsyncClient(timeout=self._timeout_s, headers=headers) as http:
                await http.get(host)
        except httpx.HTTPError:
            pass

    async def pause(self, spec: SpaceSpec) -> None:
        repo = _repo_id(spec)
        if repo is None:
            return
        await self._blocking(lambda: self._hf().pause_space(repo))  # type: ignore[attr-defined]


class FakeSpaceControl:
    """An in-memory Hub for tests and local runs: stages set by hand, calls recorded.

    ``on_wake`` / ``on_pause`` let a test make the stand-in really start or stop (for
    example launch the Gradio process 20 s after the wake).
    """

    def __init__(
        self,
        stages: dict[str, str] | None = None,
        *,
        on_wake: Callable[[str], None] | None = None,
        on_pause: Callable[[str], None] | None = None,
    ) -> None:
        self.stages: dict[str, str] = dict(stages or {})
        self.calls: list[tuple[str, str]] = []
        self._on_wake = on_wake
        self._on_pause = on_pause

    async def stage(self, spec: SpaceSpec) -> str | None:
        self.calls.append(("stage", spec.name))
        return self.stages.get(spec.name)

    async def wake(self, spec: SpaceSpec, *, restart: bool = False) -> None:
        self.calls.append(("restart" if restart else "wake", spec.name))
        if self.stages.get(spec.name) == "SLEEPING" or restart:
            self.stages[spec.name] = "APP_STARTING"
        if self._on_wake is not None:
            self._on_wake(spec.name)

    async def pause(self, spec: SpaceSpec) -> None:
        self.calls.append(("pause", spec.name))
        self.stages[spec.name] = "PAUSED"
        if self._on_pause is not None:
            self._on_pause(spec.name)

    def count(self, call: str, name: str) -> int:
        return sum(1 for c in self.calls if c == (call, name))
