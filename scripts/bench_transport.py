"""The transport benchmark alone: the pool on each transport vs a raw reused Client.

    .venv/bin/python scripts/bench_transport.py [--quick | --smoke] [--json PATH]

The same as ``scripts/bench --only transport`` (the row is described in
``scripts/_bench_transport.py``): one run prints, side by side with ratios, the 0 s
predict p50, the saturation share of G/S, the threads and RSS of a process holding
150 used connections and the first partial's lag behind the Space's yield, for every
transport the pool has ("gradio_client" today; "native" as soon as
``PoolSettings.transport`` exists). ``--quick`` shrinks the sizes (about a minute);
``--smoke`` is the tiny run ``tests/test_bench_smoke.py`` uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench  # re-executes under the project's .venv; sets paths and env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bench_transport.py", description=(__doc__ or "").splitlines()[0]
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes (the smoke test)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure here")
    args = parser.parse_args(argv)
    forwarded = ["--only", "transport"]
    if args.quick or args.smoke:
        forwarded.append("--quick")
    if args.json:
        forwarded += ["--json", args.json]
    quick = dataclasses.replace(bench.QUICK, transport="smoke" if args.smoke else "quick")
    return bench.main(forwarded, quick_plan=quick)


if __name__ == "__main__":
    sys.exit(main())
