"""The service as scripts/soak.py runs it: ``uvicorn app.main:app`` on 127.0.0.1:PORT.

    python scripts/_soak_service.py PORT

With ``SOAK_TRACE=1`` it also looks for what grows: tracemalloc (10 frames) and a count
of live objects by type, a first snapshot ``SOAK_TRACE_WARMUP_S`` (60) s in, after the
imports and the first retention windows, and a diff against it every 30 s, the top 15
of each written to ``SOAK_TRACE_FILE`` (debugging only: it slows the service several-fold).
"""

from __future__ import annotations

import gc
import linecache
import os
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import uvicorn


def _types() -> Counter[str]:
    return Counter(type(o).__qualname__ for o in gc.get_objects())


def _snapshot() -> tracemalloc.Snapshot:
    """The traces, without this module's own work (formatting reads sources: linecache)."""
    mine = [
        tracemalloc.Filter(False, f) for f in (__file__, linecache.__file__, tracemalloc.__file__)
    ]
    return tracemalloc.take_snapshot().filter_traces(mine)


def _trace(path: Path, every_s: float = 30.0) -> None:
    time.sleep(float(os.environ.get("SOAK_TRACE_WARMUP_S", "60")))  # imports, first windows
    first, first_types = _snapshot(), _types()
    while True:
        time.sleep(every_s)
        gc.collect()
        now, types = _snapshot(), _types()
        top = now.compare_to(first, "traceback")[:15]
        lines = [f"== {time.strftime('%H:%M:%S')} tracemalloc growth since warm-up"]
        for stat in top:
            lines.append(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} objects")
            lines += [f"      {frame}" for frame in stat.traceback.format()[-10:]]
        growth = Counter({k: types[k] - first_types.get(k, 0) for k in types})
        lines.append("== live objects by type, growth since warm-up")
        lines += [f"{n:+8d} {name}" for name, n in growth.most_common(15)]
        path.write_text("\n".join(lines) + "\n")


def main() -> None:
    port = int(sys.argv[1])
    if os.environ.get("SOAK_TRACE"):
        tracemalloc.start(10)
        path = Path(os.environ["SOAK_TRACE_FILE"])
        threading.Thread(target=_trace, args=(path,), daemon=True, name="soak-trace").start()
    uvicorn.run("app.main:app", host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
