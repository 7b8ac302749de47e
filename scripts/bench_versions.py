"""Two checkouts of spacepool side by side: the same benchmark rows, interleaved, compared.

    scripts/bench_versions.py BASE_CHECKOUT [--rounds 2] [--only raw,saturation,transport,rss]
                              [--quick] [--json PATH]

Runs ``scripts/bench --only ROWS --json`` of BASE_CHECKOUT (say, main before a change:
``git worktree add /tmp/base <rev>``) and of this checkout in turns, A B A B…, so that
the machine's load falls on both alike; each checkout uses its own ``.venv``. For every
row both print, it shows the figure of each version (median of its rounds, with the
min–max over rounds), the ratio new/base, and the noise: the largest spread between two
rounds of the same version, as a share of its median. A row is "worse" only when the
ratio is beyond 1 by more than that noise (in the direction where lower is better for
times, higher for throughput).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
_HIGHER_IS_BETTER = ("/s", "calls/s", "ops/s", "%")  # units where more is better


def run_bench(checkout: Path, rows: str, quick: bool, out: Path) -> None:
    cmd = [str(checkout / "scripts" / "bench"), "--only", rows, "--json", str(out)]
    if quick:
        cmd.append("--quick")
    print(f"== {checkout}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=checkout, check=False, stdout=subprocess.DEVNULL)


def figures(path: Path) -> dict[str, tuple[float, str]]:
    """(key/row) → (our median, unit) from one bench JSON."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    out = {}
    for result in data.get("results", []):
        median = (result.get("ours") or {}).get("median")
        if isinstance(median, int | float) and median == median:  # not NaN
            out[f"{result['key']}: {result['row']}"] = (float(median), str(result["unit"]))
    return out


def compare(base: list[dict[str, tuple[float, str]]], new: list[dict[str, tuple[float, str]]]
            ) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    for key in sorted(set().union(*base, *new)):
        b = [r[key][0] for r in base if key in r]
        n = [r[key][0] for r in new if key in r]
        if not b or not n:
            continue
        unit = next(r[key][1] for r in base + new if key in r)
        bm, nm = statistics.median(b), statistics.median(n)
        noise = max(
            (max(v) - min(v)) / statistics.median(v) if statistics.median(v) else 0.0
            for v in (b, n)
        )
        ratio = nm / bm if bm else float("nan")
        higher_better = unit.endswith(_HIGHER_IS_BETTER)
        change = (1 / ratio - 1) if higher_better and ratio else ratio - 1
        rows.append({"row": key, "unit": unit, "base": b, "new": n, "ratio": ratio,
                     "noise": noise, "worse": change > max(noise, 0.05)})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default="raw,saturation,transport,rss")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    base: list[dict[str, tuple[float, str]]] = []
    new: list[dict[str, tuple[float, str]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for name, checkout, into in (("base", args.base.resolve(), base), ("new", HERE, new)):
                out = Path(tmp) / f"{name}-{i}.json"
                run_bench(checkout, args.only, args.quick, out)
                into.append(figures(out))
    rows = compare(base, new)
    print("| row | base: median (rounds) | new: median (rounds) | new/base | noise | worse |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        fmt = lambda v: f"{v:.4g}"  # noqa: E731
        print(f"| {r['row']} ({r['unit']}) | {fmt(statistics.median(r['base']))} "
              f"({', '.join(map(fmt, r['base']))}) | {fmt(statistics.median(r['new']))} "
              f"({', '.join(map(fmt, r['new']))}) | {r['ratio']:.3f} | "
              f"±{r['noise'] * 100:.0f} % | {'**yes**' if r['worse'] else 'no'} |")  # fmt: skip
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
