"""Library demo: start local demo Spaces, send concurrent requests for several users
through the pool, and print what happened and the pool-stats JSON.

    .venv/bin/python scripts/demo.py [--users 8] [--requests 40] [--delay 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devspaces import SpaceFleet
from pool import Pool, PoolError, PoolSettings


async def run(args: argparse.Namespace, spaces: str) -> None:
    pool = Pool(
        PoolSettings(
            spaces=spaces,
            coordinator_url="memory://",
            global_max_concurrent=args.cap,
        )
    )
    served: Counter[str] = Counter()

    async def one(i: int) -> None:
        email = f"user{i % args.users}@example.com"
        try:
            async with pool.client(email) as client:
                await client.predict(f"request {i}", args.delay, api_name="/echo")
                served[client.space] += 1
        except PoolError as exc:
            served[f"error:{exc.kind}"] += 1

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(args.requests)))
    elapsed = time.perf_counter() - started
    print(f"{args.requests} requests from {args.users} users in {elapsed:.2f}s: {dict(served)}")
    print(json.dumps(await pool.stats(), indent=2))
    await pool.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spaces", type=int, default=2)
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--cap", type=int, default=6, help="global cap")
    args = parser.parse_args()
    spaces = os.environ.get("POOL_SPACES")
    if spaces:
        asyncio.run(run(args, spaces))
        return
    with SpaceFleet(args.spaces) as fleet:
        asyncio.run(run(args, fleet.pool_spaces_env()))


if __name__ == "__main__":
    main()
