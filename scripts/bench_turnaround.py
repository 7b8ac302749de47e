"""Where a slot's turnaround goes at saturation (issue 17's last points of G/S).

    .venv/bin/python scripts/bench_turnaround.py [--rounds R] [--callers N]

The saturation row (``scripts/_bench_transport.py``) loses its last points between a
call's end at a Space and the next call's start on the freed slot. This takes that
turnaround apart, in the same burst (N distinct users at once over 3 stand-in Spaces,
cap G = 12, service 0.5 s, the native transport), with four clocks that all read
``time.time()`` on this host:

* the Space's own interval of each call (``devspaces``: fn entered → fn returned);
* when the caller received each ``process_completed`` and sent each queue join, and
  how long each join took to be answered (``pool.transport._queue``'s ``Call`` and
  ``Session``, timed by wrapping two of their methods here; nothing in ``pool/`` does
  this).

Printed per round, p10/p50/p90: the Space's turnaround (an end → the next start on
that Space), the Space's end → the caller has the completion (Gradio's postprocess and
its message), the completion → the next join leaves (the pool: release, grant, the
next caller's request), the join → the Space starts the call (Gradio's join route,
its queue, its worker thread), and the join's own round trip. Only the middle one is
the pool's.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "scripts"), ROOT]
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _bench_saturation import _settings as saturation_settings  # noqa: E402
from _bench_saturation import pooled_burst  # noqa: E402
from _bench_transport import NATIVE, on_transport, space_share  # noqa: E402

from devspaces import SpaceFleet  # noqa: E402
from pool import Pool  # noqa: E402
from pool.transport import _session  # noqa: E402

CAP, SERVICE_S = 12, 0.5


class Clocks:
    """The caller's side: completions received, joins sent, join round trips."""

    def __init__(self) -> None:
        self.completions: list[float] = []
        self.joins: list[float] = []
        self.join_rtts: list[float] = []

    def clear(self) -> None:
        self.completions.clear()
        self.joins.clear()
        self.join_rtts.clear()

    def install(self) -> None:
        join, on_message = _session.Session._join, _session.Call._on_message
        clocks = self

        async def timed_join(self: Any, call: Any, data: list[Any]) -> str:
            sent = time.time()
            clocks.joins.append(sent)
            try:
                return await join(self, call, data)
            finally:
                clocks.join_rtts.append(time.time() - sent)

        def timed_on_message(self: Any, msg: dict[str, Any]) -> bool:
            if msg.get("msg") == "process_completed":
                clocks.completions.append(time.time())
            return on_message(self, msg)

        _session.Session._join = timed_join  # type: ignore[method-assign]
        _session.Call._on_message = timed_on_message  # type: ignore[method-assign]


def first_after(times: list[float], sorted_later: list[float]) -> list[float]:
    """For each time, how long until the first of ``sorted_later`` at or after it."""
    gaps = []
    for t in times:
        i = bisect.bisect_left(sorted_later, t)
        if i < len(sorted_later):
            gaps.append(sorted_later[i] - t)
    return gaps


def line(name: str, values: list[float]) -> str:
    v = sorted(values)
    if not v:
        return f"  {name:40s} (none)"
    at = [1000 * v[min(len(v) - 1, int(p * len(v)))] for p in (0.1, 0.5, 0.9)]
    return f"  {name:40s} p10 {at[0]:6.2f}  p50 {at[1]:6.2f}  p90 {at[2]:6.2f} ms  (n={len(v)})"


async def run(rounds: int, callers: int) -> None:
    clocks = Clocks()
    clocks.install()
    with SpaceFleet(3, startup_timeout_s=180) as fleet:
        pool = Pool(on_transport(saturation_settings(fleet, CAP), NATIVE))
        try:
            for k in range(3):  # connections open, windows climb to the cap
                await pooled_burst(pool, 2 * CAP, 0.05, f"warm{k}")
            for r in range(rounds):
                clocks.clear()
                fleet.reset()
                burst = await pooled_burst(pool, callers, SERVICE_S, f"r{r}")
                share = space_share(fleet, CAP, SERVICE_S)
                per_space = [sorted(space.intervals()) for space in fleet]
                turnaround = [
                    gap
                    for calls in per_space
                    for gap in first_after([end for _, end in calls], [s for s, _ in calls])
                ]
                ends = sorted(end for calls in per_space for _, end in calls)
                starts = sorted(start for calls in per_space for start, _ in calls)
                completions, joins = sorted(clocks.completions), sorted(clocks.joins)
                print(f"round {r}: share of G/S on the Spaces' clock {100 * share:.2f} %, "
                      f"errors {len(burst.errors)}")  # fmt: skip
                print(line("Space: end -> next start (turnaround)", turnaround))
                print(line("Space end -> completion received", first_after(ends, completions)))
                print(line("completion -> next join sent (pool)", first_after(completions, joins)))
                print(line("join sent -> Space starts the call", first_after(joins, starts)))
                print(line("join round trip", clocks.join_rtts))
        finally:
            await pool.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callers", type=int, default=240)
    args = parser.parse_args()
    asyncio.run(run(args.rounds, args.callers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
