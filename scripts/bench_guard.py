"""The outbound secret guard: today's linear scan vs the regexes it replaced (issue 28).

    .venv/bin/python scripts/bench_guard.py [--rounds R]

Each input is checked by both, interleaved round by round, in this process (the guard is
a pure function; on the service it runs before a payload leaves, off the event loop when
large). The baseline is the old rule set, copied here verbatim: its ``secret_assignment``
pattern backtracks (``[\\w.-]*`` around a keyword, then again after it), so it is timed
only on inputs small enough to finish; the larger adversarial inputs are timed on the new
guard alone, and the old guard's time there is not extrapolated in the table.

Printed per input: median (min-max) of each, and the ratio old/new of the medians.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]

from pool import RefusedByPolicy, check_outbound  # noqa: E402

_OLD = (
    re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"),
    re.compile(r"\bBearer\s+[A-Za-z0-9\-._~+/]{8,}=*", re.IGNORECASE),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"),
    re.compile(
        r"\b[\w.-]*(?:api[_-]?key|secret|token|passw(?:or)?d|passwd)[\w.-]*\s*[:=]\s*"
        r"['\"]?[^\s'\"]{6,}",
        re.IGNORECASE,
    ),
)


def old_guard(text: str) -> bool:
    return any(pattern.search(text) for pattern in _OLD)


def new_guard(text: str) -> bool:
    try:
        check_outbound((text,), {})
    except RefusedByPolicy:
        return True
    return False


def timed(check: Callable[[str], bool], text: str) -> float:
    started = time.perf_counter()
    check(text)
    return time.perf_counter() - started


def fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    prose = ("the quick brown fox jumps over the lazy dog; " * 12_000)[: 512 * 1024]
    both = {
        '"token." * 250 (1,500 chars)': "token." * 250,
        '"token." * 500 (3,000 chars, the issue\'s 8.7 s)': "token." * 500,
        "512 KiB of prose": prose,
        '512 KiB: "hf_" + "a" * N + "_"': "hf_" + "a" * (512 * 1024 - 4) + "_",
        '512 KiB: "Bearer " * N': "Bearer " * 74_898,
    }
    new_only = {'"token." * 87,000 (512 KiB)': "token." * 87_000}
    print(f"{'input':52} {'new guard':>24} {'old regexes':>26} {'old/new':>9}")
    for name, text in both.items():
        new: list[float] = []
        old: list[float] = []
        assert new_guard(text) == old_guard(text), name  # the same answer
        for _ in range(rounds):
            new.append(timed(new_guard, text))
            old.append(timed(old_guard, text))
        n, o = statistics.median(new), statistics.median(old)
        print(f"{name:52} {fmt(n):>9} ({fmt(min(new))}-{fmt(max(new))})"
              f" {fmt(o):>10} ({fmt(min(old))}-{fmt(max(old))}) {o / n:8,.1f}x")  # fmt: skip
    for name, text in new_only.items():
        new = [timed(new_guard, text) for _ in range(rounds)]
        n = statistics.median(new)
        print(f"{name:52} {fmt(n):>9} ({fmt(min(new))}-{fmt(max(new))})"
              f" {'not run (cubic)':>26}")  # fmt: skip
    print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
