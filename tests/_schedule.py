"""How ``pytest -n N --dist loadfile`` deals the test files to its workers: longest first.

xdist's loadfile hands the files out in collection order, so a long file collected late
(the soak, the conformance fleet) starts when the others are done and the run waits on
that one worker. Dealing the longest work first (LPT) ends the workers close together.

Each test's seconds (setup + call + teardown) of the last run are kept in pytest's cache
(``.pytest_cache``, key ``CACHE_KEY``); a unit's cost is the sum over its tests, from the
cache, else from ``SEED_S`` (measured on the 2-core machine, for a checkout without a
cache), else ``DEFAULT_TEST_S`` per test. Only the order changes: every file still runs
whole on one worker, its module fixtures shared.

``SHARED_UNITS`` puts files that share an expensive session fixture in one unit, so the
fixture starts on one worker only.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

CACHE_KEY = "spacepool/test_seconds"
DEFAULT_TEST_S = 1.0

# Files that use the ``every_kind`` fleet (ten Gradio processes): one worker runs both.
SHARED_UNITS = {
    "tests/transport/test_conformance.py": "every-kind",
    "tests/service/test_discovery.py": "every-kind",
}

# Seconds per file of a run with no cache (the heaviest only; others count per test).
SEED_S = {
    "every-kind": 140.0,
    "tests/service/test_soak.py": 52.0,
    "tests/test_bench_smoke.py": 51.0,
    "tests/service/test_predict.py": 55.0,
    "tests/front/test_front.py": 50.0,
    "tests/service/test_files.py": 47.0,
    "tests/test_devspaces.py": 45.0,
    "tests/fleet/test_fleet.py": 42.0,
    "tests/pool/test_resilience_fleet.py": 41.0,
    "tests/pool/test_leaks.py": 40.0,
    "tests/service/test_reclaim.py": 40.0,
    "tests/chaos/test_partitions.py": 36.0,
    "tests/service/test_dockerfile.py": 35.0,
    "tests/pool/test_scheduling.py": 32.0,
}


def unit_of(nodeid: str) -> str:
    """The work unit of a test: its file, or the shared unit its file belongs to."""
    path = nodeid.split("::", 1)[0]
    return SHARED_UNITS.get(path, path)


class LongestFirst(LoadFileScheduling):
    """loadfile, with the work units dealt out longest first."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        cache = getattr(config, "cache", None)
        known = cache.get(CACHE_KEY, {}) if cache is not None else {}
        self._seconds: dict[str, float] = known if isinstance(known, dict) else {}
        self._ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def _cost(self, unit: str, nodeids: dict[str, bool]) -> float:
        if unit in SEED_S and not any(nodeid in self._seconds for nodeid in nodeids):
            return SEED_S[unit]
        return sum(float(self._seconds.get(nodeid, DEFAULT_TEST_S)) for nodeid in nodeids)

    def _assign_work_unit(self, node: Any) -> None:
        # The first call comes right after schedule() filled the queue in collection
        # order: sort it once, then deal as xdist does.
        if not self._ordered:
            self._ordered = True
            units = sorted(self.workqueue.items(), key=lambda item: -self._cost(*item))
            self.workqueue.clear()
            self.workqueue.update(units)
        super()._assign_work_unit(node)


class Recorder:
    """Sums each test's report durations in the controlling process; saves them at the end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        cache = getattr(self.config, "cache", None)
        if cache is None or not self.seconds:
            return
        known = cache.get(CACHE_KEY, {})
        merged = dict(known) if isinstance(known, dict) else {}
        merged.update({nodeid: round(s, 2) for nodeid, s in self.seconds.items()})
        cache.set(CACHE_KEY, merged)
