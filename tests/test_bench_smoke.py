"""Smoke tests of the benchmark scripts: they run and print their rows (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_bench_quick_cycle_prints_its_rows(tmp_path: Path) -> None:
    """`scripts/bench --quick --only cycle` prints the CapacityLimiter and QueuePool rows."""
    out = tmp_path / "bench.json"
    bench = str(ROOT / "scripts" / "bench")
    proc = run([bench, "--quick", "--only", "cycle", "--json", str(out)], timeout=25)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| row |")
    rows = [line.split("|")[1].strip() for line in table[1:]]
    assert rows == ["CapacityLimiter: acquire+release cycle", "QueuePool: checkout+checkin cycle"]
    figures = json.loads(out.read_text())
    assert [r["key"] for r in figures["results"]] == ["cycle", "cycle"]
    assert all(r["ours"]["n"] > 0 and r["baseline"]["n"] > 0 for r in figures["results"])


@pytest.mark.timeout(300)
def test_bench_transport_smoke_prints_every_figure_per_transport(tmp_path: Path) -> None:
    """`bench_transport.py --smoke`: every figure per transport, each against raw."""
    transports = ["gradio_client", "native"]
    out = tmp_path / "bench.json"
    script = str(ROOT / "scripts" / "bench_transport.py")
    proc = run([sys.executable, script, "--smoke", "--json", str(out)], timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    rows = [r["row"] for r in figures["results"]]
    for transport in transports:
        for figure in ("0 s predict p50", "first partial", "saturation", "threads", "RSS"):
            assert any(row.startswith(f"transport {transport}: {figure}") for row in rows), (
                transport,
                figure,
                rows,
            )
    assert all(r["ours"]["n"] > 0 and r["baseline"]["n"] > 0 for r in figures["results"])
    assert all(r["ratio"]["n"] > 0 for r in figures["results"])
    table = [line for line in proc.stdout.splitlines() if line.startswith("| transport ")]
    assert len(table) == len(rows)
