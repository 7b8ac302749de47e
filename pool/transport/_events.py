"""Every message a Gradio queue sends about one event, as typed frozen dataclasses.

The wire names (``gradio/server_messages.py``; ``client/js/src/helpers/api_info.ts``
``handle_message`` reads the same fields): ``estimation`` (rank, queue_size,
rank_eta), ``process_starts`` (eta), ``progress`` (progress_data: index, length,
unit, progress, desc), ``log`` (log, level, title, from ``gr.Info``/``gr.Warning``),
``process_generating`` / ``process_streaming`` (a partial output),
``process_completed`` (success, output). ``heartbeat`` and ``close_stream`` concern the
stream, not an event, and are not surfaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class UpstreamQueued:
    """The Space queued the call: its place (0 = next), the queue's length, an ETA."""

    rank: int | None
    queue_size: int | None
    eta_s: float | None


@dataclass(frozen=True)
class UpstreamStarted:
    """The Space started running the call (``process_starts``)."""

    eta_s: float | None = None


@dataclass(frozen=True)
class ProgressUnit:
    """One level of a ``gr.Progress`` bar (``index`` of ``length`` ``unit``)."""

    index: float | None
    length: float | None
    unit: str | None
    progress: float | None
    desc: str | None


@dataclass(frozen=True)
class UpstreamProgress:
    """A ``gr.Progress`` update: one unit per nested bar (the outer one first)."""

    units: tuple[ProgressUnit, ...]

    @property
    def fraction(self) -> float | None:
        """The outer bar's completion in [0, 1], when the Space says."""
        if not self.units:
            return None
        unit = self.units[0]
        if unit.progress is not None:
            return float(unit.progress)
        if unit.index is not None and unit.length:
            return float(unit.index) / float(unit.length)
        return None


@dataclass(frozen=True)
class UpstreamLog:
    """A ``gr.Info`` / ``gr.Warning`` / ``gr.Success`` message (``level`` says which)."""

    level: str
    message: str
    title: str | None = None


@dataclass(frozen=True)
class UpstreamPartial:
    """A partial output of a generator endpoint, numbered from 0."""

    index: int
    output: Any


@dataclass(frozen=True)
class UpstreamDone:
    """The Space finished the call; ``success`` False: the app raised (or it was cancelled)."""

    success: bool


UpstreamEvent = (
    UpstreamQueued | UpstreamStarted | UpstreamProgress | UpstreamLog | UpstreamPartial
    | UpstreamDone
)


def progress_units(data: Any) -> tuple[ProgressUnit, ...]:
    """``progress_data`` of a ``progress`` message as units (unknown fields ignored)."""
    units = []
    for item in data or ():
        if isinstance(item, dict):
            units.append(
                ProgressUnit(
                    _number(item.get("index")),
                    _number(item.get("length")),
                    _text(item.get("unit")),
                    _number(item.get("progress")),
                    _text(item.get("desc")),
                )
            )
    return tuple(units)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def status_event(msg: dict[str, Any]) -> UpstreamEvent | None:
    """The event for a status message (queued, started, progress, log); None otherwise."""
    kind = msg.get("msg")
    if kind == "estimation":
        return UpstreamQueued(_int(msg.get("rank")), _int(msg.get("queue_size")),
                              _number(msg.get("rank_eta")))  # fmt: skip
    if kind == "process_starts":
        return UpstreamStarted(_number(msg.get("eta")))
    if kind == "progress":
        return UpstreamProgress(progress_units(msg.get("progress_data")))
    if kind == "log":
        return UpstreamLog(str(msg.get("level") or "info"), str(msg.get("log") or ""),
                           _text(msg.get("title")))  # fmt: skip
    return None
