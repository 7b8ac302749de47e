"""Partial outputs of a running job, as the Space sends them, without polling.

How partials arrive in gradio_client 2.7.2 (``utils.stream_sse_v1plus``): the Client's
one result-stream thread files each message of a job under its event id; the job's own
worker thread pops them (sleeping 50 ms when none is pending), turns every
``process_generating`` message into a full output value (diffs applied, ``gr.State``
dropped) and appends it, under ``Communicator.lock``, to ``Communicator.job.outputs``
(what ``Job.outputs()`` returns). A plain endpoint's one result is appended there too,
just before the job's future completes. The other ways in are worse: ``Job.__next__``
spins with 1 ms sleeps in a thread, ``Job.__aiter__`` reads an ``asyncio.Queue`` filled
from a foreign thread (not thread-safe; it wakes only on its own 0.5 s timeout), and
``result_callbacks`` fire only at the end.

So :class:`Outputs` takes the place of that list (same contents, swapped in under the
lock; nothing in gradio_client rebinds it): each ``append`` wakes the event loop at
once (``call_soon_threadsafe``), which adds nothing measurable to what the raw Client
already costs (the 50 ms poll above, paid alike). It also keeps only the latest
``keep`` outputs (``POOL_STREAM_KEEP``): a generator's partials are full values (a
chat's text so far), so a slow reader that skips older ones still gets the latest and
the final, and a long stream no longer grows memory with every partial. ``total``
counts every output ever appended, so indexes stay exact across what was dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any


class Outputs(list[Any]):
    """A job's outputs: the latest ``keep`` of them, and a wake-up per append."""

    def __init__(self, items: Iterable[Any], keep: int, wake: Callable[[], None]) -> None:
        items = list(items)
        super().__init__(items[-keep:])
        self.total = len(items)
        self.keep = keep
        self._wake = wake

    def append(self, item: Any) -> None:  # called by gradio_client, under its lock
        super().append(item)
        self.total += 1
        if len(self) > self.keep:
            del self[0]
        self._wake()


class Watch:
    """The event loop's view of one job's outputs: ``changed`` is set at every append."""

    def __init__(self, communicator: Any, keep: int) -> None:
        self._communicator = communicator
        self.changed = asyncio.Event()
        loop = asyncio.get_running_loop()
        changed = self.changed

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody listens
                loop.call_soon_threadsafe(changed.set)

        with communicator.lock:
            current = communicator.job.outputs
            if isinstance(current, Outputs):  # a second reader of the same job
                self._outputs = current
                previous = current._wake

                def both() -> None:
                    previous()
                    wake()

                current._wake = both
            else:
                self._outputs = Outputs(current, keep, wake)
                communicator.job.outputs = self._outputs

    def since(self, index: int) -> tuple[int, list[Any]]:
        """(index of the first returned output, outputs from ``index`` on that are kept)."""
        with self._communicator.lock:
            total = self._outputs.total
            kept = list(self._outputs)
        first = total - len(kept)
        skip = max(0, index - first)
        return first + skip, kept[skip:]


def watch(job: Any, keep: int) -> Watch | None:
    """Watch a gradio_client ``Job``'s outputs; None if it has no communicator."""
    communicator = getattr(job, "communicator", None)
    outputs = getattr(getattr(communicator, "job", None), "outputs", None)
    if communicator is None or not isinstance(outputs, list):
        return None
    return Watch(communicator, keep)
