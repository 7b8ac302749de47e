"""A pool process of the chaos tests: ``python -m tests.chaos._holder URL TEXT DELAY_S``.

One ``Pool.predict("/echo", TEXT, DELAY_S)`` through its own Pool (Spaces and caps
from ``POOL_*`` variables, coordinator ``URL``). Prints ``admitted`` once it holds its
slot, then one JSON line: ``{"ok": result}`` or ``{"error": kind, "why": ..., "at": t}``
(wall clock, the Spaces' clock).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from pool import Pool, PoolError, PoolSettings


async def main(url: str, text: str, delay_s: float) -> None:
    pool = Pool(PoolSettings(coordinator_url=url))

    async def admitted(space: str) -> None:
        print("admitted", flush=True)

    try:
        done = await pool.predict("/echo", text, delay_s, on_admitted=admitted)
        outcome: dict[str, object] = {"ok": done.result}
    except PoolError as exc:
        outcome = {"error": exc.kind, "why": getattr(exc, "why", None), "at": time.time()}
    print(json.dumps(outcome), flush=True)
    await pool.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
