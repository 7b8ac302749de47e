"""A service host of the partition test: ``python -m tests.chaos._partition_host NAME``.

One Pool (Spaces, caps and coordinator from ``POOL_*`` variables) and a steady load of
callers, each calling ``Pool.predict("/echo", NAME, delay_s, timeout=timeout_s)`` in a
loop. The load is set by JSON lines on stdin, ``{"callers": n, "delay": s, "timeout":
s}`` (callers past ``n`` stop after their current call). Prints ``ready``, then one
JSON line per answer: ``{"h": NAME, "sent": t, "done": t, "kind": "ok" | kind,
"why": ...}`` (wall clock, the Space's clock: one machine).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from pool import Pool, PoolError, PoolSettings


async def main(name: str) -> None:
    pool = Pool(PoolSettings())
    await pool.start()
    load: dict[str, Any] = {"callers": 0, "delay": 0.3, "timeout": 5.0}
    callers: list[asyncio.Task[None]] = []

    async def caller(index: int) -> None:
        while index < load["callers"]:
            sent = time.time()
            answer: dict[str, Any] = {"h": name, "sent": sent, "kind": "ok"}
            try:
                await pool.predict("/echo", name, load["delay"], timeout=load["timeout"])
            except PoolError as exc:
                answer.update(kind=exc.kind, why=getattr(exc, "why", None))
            except Exception as exc:  # reported: the test fails on it
                answer.update(kind=f"unexpected {type(exc).__name__}: {exc}")
            answer["done"] = time.time()
            print(json.dumps(answer), flush=True)
            if answer["kind"] != "ok":
                await asyncio.sleep(0.05)

    print("ready", flush=True)
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        load.update(json.loads(line))
        callers = [c for c in callers if not c.done()]
        running = len(callers)
        for index in range(running, int(load["callers"])):
            callers.append(loop.create_task(caller(index)))
    await pool.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
