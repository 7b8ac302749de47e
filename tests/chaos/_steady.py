"""A pool process under steady load: ``loops`` callers, each one request after another
until the file ``stop`` exists (at most 60 s), so requests keep arriving through a
store outage.

    python -m tests.chaos._steady <POOL_SPACES> <coordinator url> <loops> <stop> <tag> <delay_s>

Prints one JSON line: per request its start and end at the caller (wall clock) and
its outcome (``ok`` or the error's kind).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from pool import Pool, PoolError, PoolSettings


async def main(spaces: str, url: str, loops: int, stop: str, tag: str, delay_s: float) -> None:
    pool = Pool(PoolSettings(spaces=spaces, coordinator_url=url))
    records: list[dict[str, object]] = []
    until = time.monotonic() + 60

    async def loop(n: int) -> None:
        i = 0
        while time.monotonic() < until and not await asyncio.to_thread(os.path.exists, stop):
            i += 1
            began = time.time()
            try:
                async with pool.client(f"user{n}@example.com") as client:
                    result = await client.predict(f"{tag}-{n}-{i}", delay_s, api_name="/echo")
                outcome = "ok" if result == f"{client.space}:{tag}-{n}-{i}" else "wrong"
            except PoolError as exc:
                outcome = exc.kind
                await asyncio.sleep(0.1)  # a caller told "busy" comes back a little later
            records.append({"start": began, "end": time.time(), "outcome": outcome})

    await asyncio.gather(*(loop(n) for n in range(loops)))
    await pool.aclose()
    print(json.dumps(records))


if __name__ == "__main__":
    spaces, url, loops, stop, tag, delay = sys.argv[1:7]
    asyncio.run(main(spaces, url, int(loops), stop, tag, float(delay)))
