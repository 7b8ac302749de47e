"""Prometheus metrics: registered once, on a registry of our own.

Metrics read state, they do not own it (STYLE rule 8):

* counters and histograms are fed by the pool's hooks (:func:`on_pool_event`, appended
  to ``pool.hooks``) and by the access log (:func:`observe_http`);
* gauges (connections, queue, pins, admission, jobs) are read from ``pool.stats()`` at
  scrape time by :class:`_PoolCollector`, so they cannot drift from the pool.

Labels are bounded: a configured Space name, an outcome class, a route template, a
status code. Never a user, an email, a job id or anything from a payload.

With ``--workers N`` each worker has its own counters: a scrape reads one worker.
The ``*_created`` series are switched off (process-wide): they only add noise here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pool import PoolEvent

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
disable_created_metrics()  # type: ignore[no-untyped-call]
REGISTRY = CollectorRegistry(auto_describe=True)
TEAM_REGISTRY = CollectorRegistry(auto_describe=True)
"""The per-API-key series (app/teams/_usage.py): on ``/metrics`` for the admin token only —
a team's name and usage are not another team's to read (issue 38)."""

_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_RUN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

ADMISSION_WAIT = Histogram(
    "spacepool_admission_wait_seconds",
    "Time a request waited for its admission slots",
    ["space"],
    buckets=_WAIT_BUCKETS,
    registry=REGISTRY,
)
PREDICT_DURATION = Histogram(
    "spacepool_predict_duration_seconds",
    "Time a connection was leased for one request (the predict), per Space",
    ["space"],
    buckets=_RUN_BUCKETS,
    registry=REGISTRY,
)
OUTCOMES = Counter(
    "spacepool_requests",
    "Leased requests by Space and outcome class (ok or an error kind)",
    ["space", "outcome"],
    registry=REGISTRY,
)
BUSY = Counter(
    "spacepool_busy_rejections",
    "Requests that gave up waiting for admission",
    ["space", "reason"],
    registry=REGISTRY,
)
HEALTH = Counter(
    "spacepool_health_checks",
    "Health probes of idle connections by result",
    ["space", "result"],
    registry=REGISTRY,
)
ASSIGNMENTS = Counter(
    "spacepool_user_assignments",
    "Users pinned or moved to a Space",
    ["space"],
    registry=REGISTRY,
)
FAILOVERS = Counter(
    "spacepool_failovers",
    "Spaces skipped after a failure, by failure kind",
    ["space", "kind"],
    registry=REGISTRY,
)
BREAKER = Counter(
    "spacepool_breaker_transitions",
    "Circuit breaker state changes seen by this worker, by new state",
    ["space", "state"],
    registry=REGISTRY,
)
WINDOW_CHANGES = Counter(
    "spacepool_window_changes",
    "Adaptive window moves made by this worker, by direction",
    ["space", "direction"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "spacepool_retries",
    "Requests tried again, by the failure kind that caused it",
    ["space", "kind"],
    registry=REGISTRY,
)
PROVIDER_ERRORS = Counter(
    "spacepool_provider_errors",
    "Provider failures (timeout, queue_full, rate_limited, http_5xx, connect, ...)",
    ["space", "kind"],
    registry=REGISTRY,
)
POLICY_REFUSALS = Counter(
    "spacepool_policy_refusals",
    "Requests refused before sending, by reason code",
    ["space", "reason"],
    registry=REGISTRY,
)
WAKES = Counter(
    "spacepool_wakes",
    "Sleeping Spaces woken: started, awake, timeout",
    ["space", "result"],
    registry=REGISTRY,
)
PAUSES = Counter(
    "spacepool_pauses",
    "Idle Spaces paused by the pool: paused, failed",
    ["space", "result"],
    registry=REGISTRY,
)
LEASE_LOSSES = Counter(
    "spacepool_lease_losses",
    "Running requests fenced because their lease was lost: expired, missing, not_restored",
    ["space", "why"],
    registry=REGISTRY,
)
HTTP_REQUESTS = Counter(
    "spacepool_http_requests",
    "HTTP requests by method, route template and status",
    ["method", "route", "status"],
    registry=REGISTRY,
)
HTTP_DURATION = Histogram(
    "spacepool_http_request_duration_seconds",
    "HTTP request duration by route template",
    ["route"],
    buckets=_RUN_BUCKETS,
    registry=REGISTRY,
)

_SAFE = re.compile(r"^[A-Za-z0-9_.:<>{}/-]{1,80}$")


def _label(value: str | None) -> str:
    """A label value that cannot explode cardinality or carry odd characters."""
    if value is None:
        return "none"
    return value if _SAFE.match(value) else "other"


def on_pool_event(event: PoolEvent) -> None:
    """The pool hook: turn one frozen event into counter/histogram updates."""
    space = _label(event.space)
    if event.kind == "admitted":
        ADMISSION_WAIT.labels(space).observe(max(0.0, event.seconds))
    elif event.kind == "busy":
        BUSY.labels(space, _label(event.outcome)).inc()
    elif event.kind == "finished":
        PREDICT_DURATION.labels(space).observe(max(0.0, event.seconds))
        OUTCOMES.labels(space, _label(event.outcome)).inc()
    elif event.kind == "health":
        HEALTH.labels(space, _label(event.outcome)).inc()
    elif event.kind == "assignment":
        ASSIGNMENTS.labels(space).inc()
    elif event.kind == "failover":
        FAILOVERS.labels(space, _label(event.outcome)).inc()
    elif event.kind in _LABELLED:
        _LABELLED[event.kind].labels(space, _label(event.outcome)).inc()


_LABELLED = {
    "breaker": BREAKER,
    "window": WINDOW_CHANGES,
    "retry": RETRIES,
    "provider_error": PROVIDER_ERRORS,
    "policy": POLICY_REFUSALS,
    "wake": WAKES,
    "pause": PAUSES,
    "lease_lost": LEASE_LOSSES,
}


def observe_http(method: str, route: str, status: int, seconds: float) -> None:
    """Count one HTTP request (called by the access log)."""
    route = _label(route)
    HTTP_REQUESTS.labels(_label(method), route, str(status)).inc()
    HTTP_DURATION.labels(route).observe(seconds)


class _PoolCollector(Collector):
    """Gauges from the pool-stats dict and the job counts of the latest scrape."""

    def __init__(self) -> None:
        self.stats: Mapping[str, Any] = {}
        self.jobs: Mapping[str, int] = {}

    def collect(self) -> Iterator[Metric]:
        stats, jobs = self.stats, self.jobs
        per_space = {
            "spacepool_connections": ("Connections held per Space", "totalConnections"),
            "spacepool_connections_in_use": ("Connections leased per Space", "inUseConnections"),
            "spacepool_connections_available": (
                "Idle connections per Space",
                "availableConnections",
            ),
            "spacepool_connections_unhealthy": (
                "Connections failing health checks",
                "unhealthyConnections",
            ),
            "spacepool_queue_length": ("Requests waiting for a Space's slot", "queueLength"),
        }
        pools: Mapping[str, Mapping[str, Any]] = stats.get("pools", {})
        for name, (doc, key) in per_space.items():
            family = GaugeMetricFamily(name, doc, labels=["space"])
            for space, entry in pools.items():
                family.add_metric([_label(space)], float(entry.get(key) or 0))
            yield family
        windows = {
            "spacepool_window": ("Adaptive window (the Space's admission limit)", "current"),
            "spacepool_window_initial": ("Adaptive window at start", "initial"),
            "spacepool_window_peak": ("Highest adaptive window reached", "peak"),
            "spacepool_window_ceiling": ("Window ceiling (Space max, resource cap)", "ceiling"),
        }
        for name, (doc, key) in windows.items():
            family = GaugeMetricFamily(name, doc, labels=["space"])
            for space, entry in pools.items():
                if isinstance(entry.get("window"), Mapping):
                    family.add_metric([_label(space)], float(entry["window"].get(key) or 0))
            yield family
        breaker = GaugeMetricFamily(
            "spacepool_breaker_state",
            "1 for the breaker's current state",
            labels=["space", "state"],
        )
        for space, entry in pools.items():
            state = (entry.get("breaker") or {}).get("state")
            for option in ("closed", "open", "half_open"):
                if state is not None:
                    breaker.add_metric([_label(space), option], 1.0 if state == option else 0.0)
        yield breaker
        up = GaugeMetricFamily(
            "spacepool_space_up", "1 if the Space is routed to", labels=["space"]
        )
        for space, entry in pools.items():
            up.add_metric([_label(space)], 1.0 if entry.get("up", True) else 0.0)
        yield up
        admission: Mapping[str, Any] = stats.get("admission", {}) or {}
        scalars = {
            "spacepool_queued_requests": (
                "Requests waiting for admission",
                stats.get("totalQueued"),
            ),
            "spacepool_pinned_users": ("Users pinned to a Space now", stats.get("userAssignments")),
            "spacepool_global_in_use": ("Global backend slots held", admission.get("globalInUse")),
            "spacepool_global_limit": ("Global backend slot limit", admission.get("globalLimit")),
        }
        for name, (doc, value) in scalars.items():
            yield GaugeMetricFamily(name, doc, value=float(value or 0))
        by_class = GaugeMetricFamily(
            "spacepool_queued_requests_by_class",
            "Requests waiting for admission, per priority class",
            labels=["class"],
        )
        for option, count in sorted((stats.get("totalQueuedByClass") or {}).items()):
            by_class.add_metric([_label(option)], float(count or 0))
        yield by_class
        family = GaugeMetricFamily("spacepool_jobs", "Jobs kept by this worker", labels=["stage"])
        for stage, count in sorted(jobs.items()):
            family.add_metric([_label(stage)], float(count))
        yield family


_collector = _PoolCollector()
REGISTRY.register(_collector)


def render(stats: Mapping[str, Any], jobs: Mapping[str, int], *, teams: bool = False) -> bytes:
    """The exposition text, with gauges taken from ``stats`` (``await pool.stats()``);
    ``teams``: with the per-key series (:data:`TEAM_REGISTRY`)."""
    _collector.stats, _collector.jobs = stats, jobs
    text = generate_latest(REGISTRY)
    return text + generate_latest(TEAM_REGISTRY) if teams else text
