"""The benchmark smoke: ``scripts/bench --quick`` runs every row, green, within the time
BENCHMARKS.md states (no figure asserted: a missed goal is a finding, not a failure)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.stage2  # scripts/test runs it in its second stage
QUICK_LIMIT_S = 240.0  # BENCHMARKS.md: "scripts/bench --quick ... < 4 min"
GROUPS = (
    "cycle", "fairness", "queue", "stores", "fresh", "raw", "saturation", "rss", "transport",
    "replicas", "replicas-mixed", "limit", "scale-memory", "scale-sqlite", "scale-redis",
    "scale-redis-fleet",
)  # fmt: skip


def test_benchmarks_md_states_the_quick_limit() -> None:
    """BENCHMARKS.md states the limit this test holds the smoke to."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    assert re.search(r"scripts/bench --quick .*< 4 min", text), "the stated time moved"


@pytest.mark.timeout(QUICK_LIMIT_S + 60)
def test_bench_quick_runs_every_row_green(tmp_path: Path) -> None:
    """`scripts/bench --quick`: exit 0 within QUICK_LIMIT_S; every row group has rows;
    each row is measured (ours and its baseline) or says "not measured: <why>" (never
    "reported"); the transport rows give every figure per transport; with CI=true the
    Redis rows are measured (the CI machine has Redis)."""
    out = tmp_path / "bench.json"
    started = time.monotonic()
    proc = subprocess.run(
        [str(ROOT / "scripts" / "bench"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=QUICK_LIMIT_S + 30, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert took < QUICK_LIMIT_S, f"scripts/bench --quick took {took:.0f} s"
    results = json.loads(out.read_text())["results"]
    assert {r["key"] for r in results} == set(GROUPS)
    skipped = []
    for r in results:
        verdict = r["text"]["result"]
        if r["ours"]["n"] == 0:
            assert verdict.startswith("not measured: ") and r["note"], r["text"]
            skipped.append(f"{r['row']}: {r['note']}")
        else:
            assert verdict in {"met", "**missed**", "reported"}, r["text"]
            assert r["baseline"] is None or r["baseline"]["n"] > 0, r["text"]
    rows = [r["row"] for r in results]
    for transport in ("gradio_client", "native"):
        for figure in ("0 s predict p50", "first partial", "saturation", "threads", "RSS"):
            assert any(row.startswith(f"transport {transport}: {figure}") for row in rows), (
                transport, figure, rows,
            )  # fmt: skip
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        assert not [s for s in skipped if "Redis" in s], skipped
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert len(table) == len(results) + 1  # the header, then one line per row
    print(f"\nscripts/bench --quick: {len(results)} rows in {took:.0f} s; not measured:"
          f" {skipped or 'none'}")
