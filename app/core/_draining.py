"""Draining: the process was told to stop (SIGTERM/SIGINT) and uvicorn is shutting down.

uvicorn stops accepting connections, then waits for the open responses to finish (at most
``--timeout-graceful-shutdown``, then it cuts them) before the lifespan's shutdown runs.
A call in flight should get that time; a stream that never ends by itself — the Gradio
front's heartbeat — should not hold the whole shutdown for it. uvicorn tells the app
nothing until the lifespan's shutdown, so the lifespan chains the process's own handlers
of those signals (uvicorn's ``Server.capture_signals`` installs them before the lifespan
starts, in the main thread): ours marks the process draining, then calls uvicorn's.
(sse-starlette reaches the same moment by patching uvicorn's ``Server.handle_exit``.)

When the app is not run by a server that handles those signals (the default handler,
or not the main thread: an in-process test client), nothing is chained and the process
never drains: streams end with their clients, as before.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
Handler = Callable[[int, FrameType | None], Any]


class _Change(Protocol):
    async def wait(self, timeout: float | None = None) -> bool: ...


class Draining:
    """Set once a stop signal arrived; :meth:`install` / :meth:`uninstall` chain it."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._chained: dict[int, tuple[Handler, Handler]] = {}  # signal: (ours, previous)

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()

    async def or_changed(self, changed: _Change, timeout_s: float) -> bool:
        """``changed.wait(timeout_s)`` (True: a change; False: the time passed), ended
        early (True) when the process starts to drain."""
        if self._event.is_set():
            return await changed.wait(timeout_s)
        change = asyncio.ensure_future(changed.wait(timeout_s))
        drain = asyncio.ensure_future(self.wait())
        try:
            await asyncio.wait((change, drain), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (change, drain):
                waiting.cancel()
            await asyncio.gather(change, drain, return_exceptions=True)
        return (drain.done() and not drain.cancelled()) or change.result()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for sig in _SIGNALS:
            previous = signal.getsignal(sig)
            if not callable(previous) or previous is signal.default_int_handler:
                continue  # no server handles it: it would stop the process as before

            def ours(signum: int, frame: FrameType | None, previous: Handler = previous) -> None:
                loop.call_soon_threadsafe(self._event.set)
                previous(signum, frame)

            signal.signal(sig, ours)
            self._chained[sig] = (ours, previous)

    def uninstall(self) -> None:
        """Give the signals back to their previous handlers (unless someone replaced ours)."""
        for sig, (ours, previous) in self._chained.items():
            if signal.getsignal(sig) is ours:
                signal.signal(sig, previous)
        self._chained.clear()
