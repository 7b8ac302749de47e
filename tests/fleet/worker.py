"""One worker process of the fleet tests: N concurrent requests through its own Pool.

    python -m tests.fleet.worker <POOL_SPACES> <coordinator url> <requests> <tag> [delay_s]

Caps come from POOL_* variables. Prints one JSON line: per request the consumer, the
lease interval (wall clock, inside ``get_client``) and the outcome.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from pool import Pool, PoolError, PoolSettings


async def main(spaces: str, url: str, count: int, tag: str, delay_s: float = 0.05) -> None:
    pool = Pool(PoolSettings(spaces=spaces, coordinator_url=url))
    records: list[dict[str, object]] = []

    async def one(i: int) -> None:
        user = f"user{i % 8}@example.com"
        try:
            async with pool.client(user) as client:
                start = time.time()
                result = await client.predict(f"{tag}-{i}", delay_s, api_name="/echo")
                end = time.time()
            ok = result == f"{client.space}:{tag}-{i}"
            records.append({"user": user, "start": start, "end": end, "ok": ok})
        except PoolError as exc:
            records.append({"user": user, "error": exc.kind})

    await asyncio.gather(*(one(i) for i in range(count)))
    await pool.aclose()
    print(json.dumps(records))


if __name__ == "__main__":
    delay = float(sys.argv[5]) if len(sys.argv) > 5 else 0.05
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], delay))
