"""Usage per API key and per user, and the keys' daily quotas (issue 32).

**Metered from the pool's own events.** The boundary (app/edge/_auth.py) gives each call
request a :class:`Meter` in a context variable; asyncio copies it into every task the
call starts (a job's runner, a Gradio front event), so the pool's hooks, which run in
the call's own task, find it: ``admitted`` (seconds waited), ``finished`` (seconds a
Space was held; an error kind), ``busy``, ``policy``. The first of them counts the
call (a call refused before it reached the pool — a bad body — is no call). The user
is the keyed hash the handler put in the request's log context (never an email).

**Kept in the coordinator, hourly, for a week.** Each process adds up what it saw and
writes it every ``FLUSH_S`` (and at shutdown) into one shared value per key and hour
(``usage:<key id>:<hour>``: calls, errors by class, Space-seconds, admission-wait
seconds, the same per user), through :meth:`SharedValues.update`, so every worker's
figures add up; a store that does not answer keeps them for the next flush.

**Quotas, before any slot.** A key's daily figures (``quota:<key id>:<UTC day>``) are
checked, and its call counted, atomically as the request enters (one store update);
a quota reached is ``429`` with ``Retry-After`` the seconds to the next UTC day, and
an error of class ``quota_daily_calls`` / ``quota_daily_space_seconds`` in the key's
usage (not a call).
``daily_space_seconds`` counts running calls as they run (issue 38): each worker adds
the seconds its running calls of the key have held a Space so far to that day's value
(``running``: per worker, renewed every flush, ignored once :data:`RUNNING_STALE_S`
old), and a call is refused — at entry, and again once admitted (app/edge/_auth.py
``GATE``) — when used + running reaches the quota. So the overrun is at most what the
key's calls already running (admitted before the quota was reached) go on to use.

Callers without a key are metered too: the shared ``POOL_API_TOKEN`` as ``token``,
unauthenticated ones as ``open``.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import functools
import io
import json
import logging
import math
import secrets
import time
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter

from pool import BusyError, PoolEvent, UserLimitReached, cancel_and_wait, cancelling
from pool.admission import SharedValues

from ..core import TEAM_REGISTRY, RequestContext
from ._keys import KeyRecord

_log = logging.getLogger("spacepool.app")

FLUSH_S = 0.5
KEEP_S = 8 * 86400.0  # an hour's figures are kept 7 days (and a day of slack)
HOUR_S = 3600
DAY_S = 86400
RUNNING_STALE_S = 5.0  # a worker's running figure older than this: that worker is gone
_NS = "usage:"
_QUOTA = "quota:"
MAX_LABELS = 64  # distinct key names a worker labels its metrics with; then "other"
MAX_USERS = 2000  # users kept apart in one key's hour; the rest together as OTHER_USERS
OTHER_USERS = "other"

TOKEN_KEY = ("token", "POOL_API_TOKEN")
OPEN_KEY = ("open", "no key")

KEY_CALLS = Counter("spacepool_key_calls", "Calls per API key", ["key"], registry=TEAM_REGISTRY)
KEY_ERRORS = Counter(
    "spacepool_key_errors", "Failed attempts per API key, by class", ["key", "class"],
    registry=TEAM_REGISTRY,
)  # fmt: skip
KEY_SPACE_S = Counter(
    "spacepool_key_space_seconds", "Seconds of Space time held per API key", ["key"],
    registry=TEAM_REGISTRY,
)  # fmt: skip
KEY_UPLOAD_BYTES = Counter(
    "spacepool_key_upload_bytes", "Bytes of files uploaded to the front per API key", ["key"],
    registry=TEAM_REGISTRY,
)  # fmt: skip
KEY_WAIT_S = Counter(
    "spacepool_key_admission_wait_seconds", "Seconds waited for admission per API key",
    ["key"], registry=TEAM_REGISTRY,
)  # fmt: skip
_labels: set[str] = set()


def key_label(name: str) -> str:
    """``name``, or ``other`` once this worker labelled ``MAX_LABELS`` names."""
    if name in _labels or len(_labels) < MAX_LABELS:
        _labels.add(name)
        return name
    return "other"


@dataclass
class Meter:
    """One call request's usage so far (module docstring)."""

    key_id: str
    key_name: str
    ctx: RequestContext
    counted: bool = False


METER: ContextVar[Meter | None] = ContextVar("spacepool_meter", default=None)


@dataclass
class Figures:
    """Usage figures of one key or user over some time."""

    calls: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    space_s: float = 0.0
    wait_s: float = 0.0
    uploads: int = 0  # files uploaded to the front (kept in the service's file store)
    upload_bytes: int = 0

    def add(self, other: Figures | dict[str, Any]) -> None:
        o = other if isinstance(other, Figures) else Figures.of(other)
        self.calls += o.calls
        self.space_s += o.space_s
        self.wait_s += o.wait_s
        self.uploads += o.uploads
        self.upload_bytes += o.upload_bytes
        for kind, n in o.errors.items():
            self.errors[kind] = self.errors.get(kind, 0) + n

    @staticmethod
    def of(raw: dict[str, Any]) -> Figures:
        return Figures(
            int(raw.get("calls", 0)), {str(k): int(v) for k, v in raw.get("errors", {}).items()},
            float(raw.get("space_s", 0.0)), float(raw.get("wait_s", 0.0)),
            int(raw.get("uploads", 0)), int(raw.get("upload_bytes", 0)),
        )  # fmt: skip

    def json(self) -> dict[str, Any]:
        return {"calls": self.calls, "errors": dict(sorted(self.errors.items())),
                "space_s": round(self.space_s, 3), "wait_s": round(self.wait_s, 3),
                "uploads": self.uploads, "upload_bytes": self.upload_bytes}  # fmt: skip


@dataclass
class _Bucket:
    """One key's hour, as this worker saw it since its last flush."""

    name: str
    total: Figures = field(default_factory=Figures)
    users: dict[str, Figures] = field(default_factory=dict)


def _merge(current: str | None, delta: _Bucket) -> str:
    raw: dict[str, Any] = json.loads(current) if current else {}
    total = Figures.of(raw)
    total.add(delta.total)
    users = raw.get("users", {})
    for user, figures in delta.users.items():
        if user not in users and len(users) >= MAX_USERS:
            user = OTHER_USERS  # a bounded value: the rest of the hour's users together
        mine = Figures.of(users.get(user, {}))
        mine.add(figures)
        users[user] = mine.json()
    return json.dumps({"name": delta.name, **total.json(), "users": users})


def next_day_s(now: float) -> float:
    """Seconds until the next UTC day (a daily quota's window)."""
    return DAY_S - now % DAY_S


class Usage:
    """This worker's usage, written to the coordinator (module docstring)."""

    def __init__(self, values: Callable[[], SharedValues], clock: Callable[[], float] = time.time):
        self._values = values
        self._clock = clock
        self._pending: dict[tuple[str, int], _Bucket] = {}
        self._space_s: dict[tuple[str, int], float] = {}  # (key id, day) → to add to quota
        self._running: dict[str, dict[int, float]] = {}  # key id → {meter: admitted at}
        self._shown: set[str] = set()  # keys whose running figure this worker wrote
        self.worker = secrets.token_hex(8)
        self._flusher: asyncio.Task[None] | None = None

    # -- metering (no await: pool hooks are plain calls) ---------------------------------
    def on_event(self, event: PoolEvent) -> None:
        """A pool hook: attribute ``event`` to the call whose context it runs in."""
        meter = METER.get()
        if meter is None or event.kind not in {"admitted", "finished", "busy", "policy"}:
            return
        now = self._clock()
        bucket = self._pending.setdefault(
            (meter.key_id, int(now // HOUR_S)), _Bucket(meter.key_name)
        )
        user = meter.ctx.user or "anonymous"
        mine = bucket.users.setdefault(user, Figures())
        label = key_label(meter.key_name)
        step = Figures()
        if not meter.counted:
            meter.counted = True
            step.calls = 1
            KEY_CALLS.labels(label).inc()
        if event.kind == "admitted":
            step.wait_s = event.seconds
            KEY_WAIT_S.labels(label).inc(event.seconds)
            running = self._running.setdefault(meter.key_id, {})
            if id(meter) not in running:  # a call admitted then not released (its Space
                # could not be reached) ends with its meter, if not with "finished"
                weakref.finalize(meter, self._stopped, meter.key_id, id(meter))
            running[id(meter)] = now
        elif event.kind == "finished":
            self._stopped(meter.key_id, id(meter))
            step.space_s = event.seconds
            KEY_SPACE_S.labels(label).inc(event.seconds)
            day = (meter.key_id, int(now // DAY_S))
            self._space_s[day] = self._space_s.get(day, 0.0) + event.seconds
        error = {"busy": "busy", "policy": "refused"}.get(event.kind)
        if event.kind == "finished" and event.outcome not in (None, "ok"):
            error = event.outcome
        if error is not None:
            step.errors[error] = 1
            KEY_ERRORS.labels(label, error).inc()
        bucket.total.add(step)
        mine.add(step)

    def on_upload(self, size: int) -> None:
        """A file of ``size`` bytes uploaded to the front by the current request's
        caller: counted in its key's and user's usage (not a call)."""
        meter = METER.get()
        if meter is None:
            return
        now = self._clock()
        bucket = self._pending.setdefault(
            (meter.key_id, int(now // HOUR_S)), _Bucket(meter.key_name)
        )
        step = Figures(uploads=1, upload_bytes=size)
        bucket.total.add(step)
        bucket.users.setdefault(meter.ctx.user or "anonymous", Figures()).add(step)
        KEY_UPLOAD_BYTES.labels(key_label(meter.key_name)).inc(size)

    # -- writing ----------------------------------------------------------------------
    def start(self) -> None:
        self._flusher = asyncio.get_running_loop().create_task(self._run())

    async def aclose(self) -> None:
        if self._flusher is not None:
            await cancel_and_wait(self._flusher)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush(), 2.0)

    async def _run(self) -> None:
        while True:
            if cancelling():  # a flush swallowed the cancel (a store error): end here
                raise asyncio.CancelledError
            await asyncio.sleep(FLUSH_S)
            try:
                await self.flush()
            except BusyError:
                pass  # kept for the next flush
            except Exception:
                _log.exception("usage flush failed")

    def _stopped(self, key_id: str, meter: int) -> None:
        running = self._running.get(key_id, {})
        running.pop(meter, None)
        if not running:
            self._running.pop(key_id, None)

    def running_s(self, key_id: str, now: float) -> tuple[int, float]:
        """The key's calls running on this worker, and the seconds they held so far."""
        started = self._running.get(key_id, {}).values()
        return len(started), sum(max(0.0, now - t) for t in started)

    def _mine_s(self, key_id: str, now: float) -> float:
        """The key's Space-seconds of today this worker has not written yet: its running
        calls' so far, and its finished calls' not flushed."""
        unflushed = self._space_s.get((key_id, int(now // DAY_S)), 0.0)
        return self.running_s(key_id, now)[1] + unflushed

    async def flush(self) -> None:
        """Write what this worker saw since the last flush (kept on failure)."""
        pending, self._pending = self._pending, {}
        space_s, self._space_s = self._space_s, {}
        values = self._values()
        now = self._clock()
        day_now = int(now // DAY_S)
        for key_id in set(self._running) | self._shown:  # running figures, this worker's
            count, held = self.running_s(key_id, now)
            show = functools.partial(_show_running, worker=self.worker, figure=[count, held, now])
            with contextlib.suppress(BusyError):
                await values.update(f"{_QUOTA}{key_id}:{day_now}", show, 2 * DAY_S)
                if count:
                    self._shown.add(key_id)
                else:
                    self._shown.discard(key_id)
        try:
            while pending:
                (key_id, hour), bucket = next(iter(pending.items()))
                merge = functools.partial(_merge, delta=bucket)
                await values.update(f"{_NS}{key_id}:{hour}", merge, KEEP_S)
                del pending[(key_id, hour)]
            while space_s:
                (key_id, day), seconds = next(iter(space_s.items()))
                add = functools.partial(_add_space, seconds=seconds)
                await values.update(f"{_QUOTA}{key_id}:{day}", add, 2 * DAY_S)
                del space_s[(key_id, day)]
        except BaseException:
            for k, b in pending.items():  # back in front of what came meanwhile
                mine = self._pending.setdefault(k, _Bucket(b.name))
                mine.total.add(b.total)
                for user, figures in b.users.items():
                    mine.users.setdefault(user, Figures()).add(figures)
            for k, s in space_s.items():
                self._space_s[k] = self._space_s.get(k, 0.0) + s
            raise

    # -- quotas ---------------------------------------------------------------------------
    async def admit_call(self, record: KeyRecord) -> int:
        """Count a call of ``record``'s key today (the day's number, for
        :meth:`unspend_call`), or raise ``UserLimitReached`` (429) if a daily quota is
        reached: nothing counted, no slot taken."""
        now = self._clock()
        refused: list[str] = []

        mine = self._mine_s(record.id, now)

        def bump(current: str | None) -> str | None:
            refused.clear()
            day = json.loads(current) if current else {"calls": 0, "space_s": 0.0}
            if record.daily_calls is not None and day["calls"] >= record.daily_calls:
                refused.append("daily_calls")
            elif (
                record.daily_space_seconds is not None
                and _spent(day, now, self.worker) + mine >= record.daily_space_seconds
            ):
                refused.append("daily_space_seconds")
            if refused:
                return None
            day["calls"] += 1
            return json.dumps(day)

        await self._values().update(f"{_QUOTA}{record.id}:{int(now // DAY_S)}", bump, 2 * DAY_S)
        if refused:
            self._note_refusal(record, f"quota_{refused[0]}", now)
            raise _quota_reached(record, refused[0], now)
        return int(now // DAY_S)

    async def may_start(self, record: KeyRecord) -> None:
        """A call of ``record``'s key, admitted, may start: not when its finished and
        running calls used its ``daily_space_seconds`` (``UserLimitReached``, 429)."""
        if record.daily_space_seconds is None:
            return
        now = self._clock()
        raw = await self._values().get(f"{_QUOTA}{record.id}:{int(now // DAY_S)}")
        day = json.loads(raw) if raw else {"calls": 0, "space_s": 0.0}
        mine = self._mine_s(record.id, now)
        if _spent(day, now, self.worker) + mine >= record.daily_space_seconds:
            self._note_refusal(record, "quota_daily_space_seconds", now)
            raise _quota_reached(record, "daily_space_seconds", now)

    def _note_refusal(self, record: KeyRecord, error: str, now: float) -> None:
        """A call ``record``'s quota refused: an error of that class in the key's usage
        (not a call: nothing was admitted; no user yet, the body is not read)."""
        bucket = self._pending.setdefault((record.id, int(now // HOUR_S)), _Bucket(record.name))
        bucket.total.add(Figures(errors={error: 1}))
        KEY_ERRORS.labels(key_label(record.name), error).inc()

    async def unspend_call(self, record: KeyRecord, day: int) -> None:
        """Give back a call :meth:`admit_call` counted on ``day`` that was never made."""

        def drop(current: str | None) -> str | None:
            if not current:
                return None
            figures = json.loads(current)
            figures["calls"] = max(0, figures["calls"] - 1)
            return json.dumps(figures)

        await self._values().update(f"{_QUOTA}{record.id}:{day}", drop, 2 * DAY_S)

    # -- reading ----------------------------------------------------------------------
    async def rows(
        self, *, key: str | None = None, user: str | None = None, since: float = 0.0,
        until: float = math.inf,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
        """Per key and hour (oldest first), and per user over the range (most calls
        first), filtered by key (name or id), user hash and time (epoch seconds)."""
        with contextlib.suppress(BusyError):
            await self.flush()  # this worker's own latest figures first
        found = await self._values().scan(_NS)
        hours: list[dict[str, Any]] = []
        users: dict[tuple[str, str], tuple[str, Figures]] = {}
        for name_key, raw_text in found.items():
            key_id, _, hour_text = name_key[len(_NS) :].rpartition(":")
            raw = json.loads(raw_text)
            hour = int(hour_text) * HOUR_S
            if not since <= hour + HOUR_S - 1 or hour >= until:
                continue
            if key is not None and key not in (key_id, raw.get("name")):
                continue
            per_user = raw.get("users", {})
            if user is not None:
                if user not in per_user:
                    continue
                figures = Figures.of(per_user[user])
            else:
                figures = Figures.of(raw)
            hours.append({"hour": _iso(hour), "key_id": key_id, "key": raw.get("name"),
                          **figures.json()})  # fmt: skip
            for who, theirs in per_user.items():
                if user is not None and who != user:
                    continue
                entry = users.setdefault((key_id, who), (raw.get("name", ""), Figures()))
                entry[1].add(theirs)
        hours.sort(key=lambda r: (r["hour"], r["key"] or ""))
        top = [{"key_id": k, "key": name, "user": who, **f.json()}
               for (k, who), (name, f) in users.items()]  # fmt: skip
        top.sort(key=lambda r: (-r["calls"], -r["space_s"]))
        return hours, top


def _quota_reached(record: KeyRecord, what: str, now: float) -> UserLimitReached:
    limit = record.daily_calls if what == "daily_calls" else record.daily_space_seconds
    return UserLimitReached(
        f"the key {record.name!r} reached its {what} quota ({limit}); it renews at"
        " 00:00 UTC", reason=f"quota_{what}", limit=int(limit or 0),
        retry_after_s=math.ceil(next_day_s(now)),
    )  # fmt: skip


def _spent(day: dict[str, Any], now: float, worker: str) -> float:
    """A day's Space-seconds: the finished calls', and the running calls' of every
    other worker so far (their last figure, carried on to ``now``; a stale one, of a
    worker gone, is not counted)."""
    spent = float(day.get("space_s", 0.0))
    for who, figure in dict(day.get("running") or {}).items():
        try:
            count, held, at = int(figure[0]), float(figure[1]), float(figure[2])
        except (TypeError, ValueError, IndexError):
            continue
        if who != worker and now - at < RUNNING_STALE_S:
            spent += held + count * max(0.0, now - at)
    return spent


def _show_running(current: str | None, worker: str, figure: list[float]) -> str | None:
    """The day's value with ``worker``'s running figure (dropped when nothing runs)."""
    day: dict[str, Any] = json.loads(current) if current else {"calls": 0, "space_s": 0.0}
    running = dict(day.get("running") or {})
    if figure[0]:
        running[worker] = figure
    elif worker in running:
        del running[worker]
    else:
        return None
    day["running"] = running
    return json.dumps(day)


def _add_space(current: str | None, seconds: float) -> str:
    day = json.loads(current) if current else {"calls": 0, "space_s": 0.0}
    day["space_s"] = float(day["space_s"]) + seconds
    return json.dumps(day)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def as_csv(hours: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["hour", "key_id", "key", "calls", "errors", "space_s", "wait_s",
                     "uploads", "upload_bytes"])  # fmt: skip
    for row in hours:
        errors = ";".join(f"{k}={v}" for k, v in row["errors"].items())
        writer.writerow([row["hour"], row["key_id"], row["key"], row["calls"], errors,
                         row["space_s"], row["wait_s"], row["uploads"],
                         row["upload_bytes"]])  # fmt: skip
    return out.getvalue()
