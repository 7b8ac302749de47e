"""What gradio_client's 50 ms result poll costs a predict (the saturation row's gap).

    .venv/bin/python scripts/bench_sse_poll.py [--calls N] [--rounds R]

gradio_client reads a job's result in ``utils.get_pred_from_sse_v1plus``: a loop that
pops the messages its stream thread appends and, when there is none yet, calls
``time.sleep(0.05)``. So a result that has arrived waits up to 50 ms before the
caller sees it, on every predict. This script measures one raw reused Client (with
the pool's shared SSL context) on a local stand-in Space, call by call, as it is and
with that module's ``time.sleep`` capped at 2 ms (a what-if, restored afterwards;
nothing in ``pool/`` does this), rounds alternating, for a 0 s and a 0.5 s service.
It prints p50 per variant and what ``12 / call time`` gives against G/S = 12 / 0.5 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "scripts"), ROOT]
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gradio_client.utils as gradio_utils  # noqa: E402
from _bench_clients import open_raw  # noqa: E402

from devspaces import SpaceFleet  # noqa: E402
from pool.transport._fallback import close_client  # noqa: E402

REAL_TIME = gradio_utils.time


def capped_time(cap_s: float) -> Any:
    """The ``time`` module as gradio_client.utils sees it, ``sleep`` capped."""
    shim = types.SimpleNamespace(
        **{k: getattr(REAL_TIME, k) for k in dir(REAL_TIME) if not k.startswith("__")}
    )
    shim.sleep = lambda seconds: REAL_TIME.sleep(min(seconds, cap_s))
    return shim


def calls_ms(client: Any, n: int, service_s: float) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        client.predict(str(i), service_s, api_name="/echo")
        out.append(1000 * (time.perf_counter() - started))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10, help="calls per variant per round")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    fleet = SpaceFleet(1, startup_timeout_s=180)
    try:
        client = open_raw(fleet["alpha"].url, shared_ssl=True)
        calls_ms(client, 3, 0)
        samples: dict[tuple[float, str], list[float]] = {}
        for r in range(args.rounds):
            for variant in ("as is", "poll capped at 2 ms")[:: 1 if r % 2 == 0 else -1]:
                gradio_utils.time = REAL_TIME if variant == "as is" else capped_time(0.002)
                try:
                    for service_s in (0.0, 0.5):
                        samples.setdefault((service_s, variant), []).extend(
                            calls_ms(client, args.calls, service_s)
                        )
                finally:
                    gradio_utils.time = REAL_TIME
        close_client(client)
    finally:
        fleet.stop()
    print(
        f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
        f"{args.rounds} rounds × {args.calls} calls per variant and service time"
    )
    for (service_s, variant), values in samples.items():
        p50 = statistics.median(values)
        line = (
            f"service {service_s:.1f} s, {variant:20s}: p50 {p50:6.1f} ms "
            f"({min(values):.1f}–{max(values):.1f})"
        )
        if service_s:
            line += f"; 12 / call = {12000 / p50:.1f}/s = {100 * 500 / p50:.0f} % of G/S"
        print(line)


if __name__ == "__main__":
    main()
