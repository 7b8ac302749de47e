"""What the Space says about a running call, as fields of the job and stream JSON.

``upstream_rank`` / ``upstream_eta_s``: the call's place in the Space's own queue (0 =
next) and the Space's estimate, from ``UpstreamQueued``; ``progress``: the latest
``gr.Progress`` bars (``[{"index", "length", "unit", "progress", "desc"}]``, the outer
bar first); ``log``: the latest ``gr.Info``/``gr.Warning`` (``{"level", "message",
"title"}``). Partials and the end have fields of their own.

Only changes are shown (:class:`UpstreamView`): rank 0 (next in line, about to start)
counts as not queued, so a call the Space starts at once adds no event.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pool import UpstreamEvent, UpstreamLog, UpstreamProgress, UpstreamQueued, UpstreamStarted


class UpstreamView:
    """What one call's caller was shown so far; :meth:`update` returns what changed."""

    def __init__(self) -> None:
        self.shown: dict[str, Any] = {"upstream_rank": None, "upstream_eta_s": None}

    def update(self, event: UpstreamEvent) -> dict[str, Any] | None:
        """The fields to show after ``event`` (None: nothing new)."""
        fields = event_fields(event)
        if fields is None:
            return None
        if not fields.get("upstream_rank", 1):  # rank 0: starting now, not waiting
            fields = {"upstream_rank": None, "upstream_eta_s": None}
        changed = {k: v for k, v in fields.items() if self.shown.get(k, object()) != v}
        self.shown.update(changed)
        return changed or None


def event_fields(event: UpstreamEvent) -> dict[str, Any] | None:
    """The fields ``event`` sets (None: it sets none)."""
    if isinstance(event, UpstreamQueued):
        return {"upstream_rank": event.rank, "upstream_eta_s": event.eta_s}
    if isinstance(event, UpstreamStarted):
        return {"upstream_rank": None, "upstream_eta_s": None}
    if isinstance(event, UpstreamProgress):
        return {"progress": [dataclasses.asdict(unit) for unit in event.units]}
    if isinstance(event, UpstreamLog):
        return {"log": {"level": event.level, "message": event.message, "title": event.title}}
    return None
