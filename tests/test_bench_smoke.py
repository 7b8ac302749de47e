"""Smoke test of the benchmark script: it runs and prints its rows (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_quick_cycle_prints_its_rows(tmp_path: Path) -> None:
    """`scripts/bench --quick --only cycle` prints the CapacityLimiter and QueuePool rows."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [str(ROOT / "scripts" / "bench"), "--quick", "--only", "cycle", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=25,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| row |")
    rows = [line.split("|")[1].strip() for line in table[1:]]
    assert rows == ["CapacityLimiter: acquire+release cycle", "QueuePool: checkout+checkin cycle"]
    figures = json.loads(out.read_text())
    assert [r["key"] for r in figures["results"]] == ["cycle", "cycle"]
    assert all(r["ours"]["n"] > 0 and r["baseline"]["n"] > 0 for r in figures["results"])
