"""Figures of ``scripts/bench``: summaries over repetitions, results, the table.

Every row of the benchmark is measured in *repetitions* (rounds) that interleave the
compared variants, so the machine's noise hits both alike. A :class:`Result` keeps
one figure per repetition for our side, for the yardstick, and for their ratio, and
prints the median with the min–max over the repetitions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

RatioStyle = Literal["times", "overhead", "share"]


@dataclass(frozen=True)
class Summary:
    """Median and min–max of one figure over ``n`` values (repetitions or samples)."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        finite = [v for v in values if not math.isnan(v)]
        if not finite:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(finite), min(finite), max(finite), len(finite))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 100]; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Per-repetition ratios (NaN where the denominator is zero)."""
    return [a / b if b else math.nan for a, b in zip(numerators, denominators, strict=True)]


def fmt_value(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    if unit == "/s":
        return f"{value:,.1f}/s" if value < 100 else f"{value:,.0f}/s"
    if unit in ("MB", "threads", "calls"):
        return f"{value:,.0f} {unit}" if value >= 100 else f"{value:,.1f} {unit}"
    if unit in ("ms", "µs"):
        return f"{value:.2f} {unit}" if value < 10 else f"{value:,.1f} {unit}"
    if unit == "s":
        return f"{value:.2f} s"
    return f"{value:g} {unit}"


def fmt_summary(summary: Summary, unit: str) -> str:
    if summary.n == 0:
        return "n/a"
    if summary.n == 1 or summary.low == summary.high:
        return fmt_value(summary.median, unit)
    bare = unit if unit in ("/s",) else ""
    low, high = fmt_value(summary.low, unit), fmt_value(summary.high, unit)
    if not bare:  # print the unit once: "169.1 ms (97.6–302.5)"
        low, high = low.rsplit(" ", 1)[0], high.rsplit(" ", 1)[0]
    return f"{fmt_value(summary.median, unit)} ({low}–{high})"


def fmt_ratio(value: float, style: RatioStyle) -> str:
    if math.isnan(value):
        return "n/a"
    if style == "overhead":
        return f"{100 * (value - 1):+.1f} %"
    if style == "share":
        return f"{100 * value:.1f} %"
    return f"{value:.2f}×"


@dataclass
class Result:
    """One line of the table: our figure, its yardstick, their ratio, the goal."""

    key: str  # the --only name of the row group ("fresh", "cycle", ...)
    row: str  # the label in the table
    unit: str
    ours: Summary
    ours_label: str
    baseline: Summary | None = None
    baseline_label: str = ""
    baseline_unit: str = ""
    ratio: Summary | None = None
    ratio_style: RatioStyle = "times"
    goal: str = ""
    met: bool | None = None  # None: reported only, or not measured
    note: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    load: Summary | None = None  # 1-minute load average while the row ran

    def cells(self) -> list[str]:
        ours = f"{self.ours_label}: {fmt_summary(self.ours, self.unit)}"
        base = (
            f"{self.baseline_label}: {fmt_summary(self.baseline, self.baseline_unit or self.unit)}"
            if self.baseline is not None
            else "—"
        )
        if self.ratio is None or self.ratio.n == 0:
            ratio = "—"
        elif self.ratio.n == 1 or self.ratio.low == self.ratio.high:
            ratio = fmt_ratio(self.ratio.median, self.ratio_style)
        else:
            ratio = (
                f"{fmt_ratio(self.ratio.median, self.ratio_style)} "
                f"({fmt_ratio(self.ratio.low, self.ratio_style)} – "
                f"{fmt_ratio(self.ratio.high, self.ratio_style)})"
            )
        verdict = {True: "met", False: "**missed**", None: "reported"}[self.met]
        if self.ours.n == 0 and self.ours_label == "not measured":
            verdict = f"not measured: {self.note}"  # a skip says why, never "reported"
        load = "—" if self.load is None else fmt_load(self.load)
        return [self.row, ours, base, ratio, self.goal or "—", verdict, load]

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["text"] = dict(
            zip(
                ["row", "ours", "baseline", "ratio", "goal", "result", "load"],
                self.cells(),
                strict=True,
            )
        )
        return data


HEADER = [
    "row",
    "ours: median (min–max)",
    "compared with",
    "ratio (min–max)",
    "goal",
    "result",
    "load avg",
]


def fmt_load(load: Summary) -> str:
    """The 1-minute load average over a row: median (min–max)."""
    if load.n == 0:
        return "n/a"
    if load.low == load.high:
        return f"{load.median:.1f}"
    return f"{load.median:.1f} ({load.low:.1f}–{load.high:.1f})"


def markdown_table(results: Sequence[Result]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for result in results:
        lines.append("| " + " | ".join(result.cells()) + " |")
    return "\n".join(lines)


def not_measured(key: str, row: str, goal: str, why: str) -> Result:
    """A row that could not run here (e.g. no Redis): says so instead of vanishing."""
    return Result(key, row, "", Summary.of([]), "not measured", goal=goal, met=None, note=why)
