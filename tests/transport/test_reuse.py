"""The native transport's connections to a Space: kept alive across busy calls, and the
heartbeat stream opened only by a session whose call needs it (gr.State)."""

from __future__ import annotations

import asyncio
from typing import Any

from devspaces import SpaceFleet
from pool import Pool, PoolSettings
from pool.transport import AppInfo

from .test_native import recording

ROUNDS, AT_ONCE = 3, 4


async def test_busy_sessions_reuse_their_tcp_connections_and_stateless_calls_open_no_heartbeat(
    fleet: SpaceFleet,
) -> None:
    """Rounds of 4 calls at once on 4 pooled connections: after the first round no new
    TCP connection reaches the Space (the keep-alive cap once closed all but 3, and
    each lease held a heartbeat stream of its own); /echo touches no gr.State, so no
    heartbeat is opened until a /state call asks for one."""
    async with recording(fleet["alpha"].url) as (rec, url):
        pool = Pool(PoolSettings(spaces=f"alpha={url}", coordinator_url="memory://",
                                 min_connections=1, max_connections=AT_ONCE))  # fmt: skip
        try:
            rounds: list[int] = []
            for r in range(ROUNDS):
                rounds.append(len(rec.seen))
                await asyncio.gather(*(pool.predict("/echo", f"{r}.{i}", 0.3, email=f"u{i}@x.y")
                                       for i in range(AT_ONCE)))  # fmt: skip
            stateless = len(rec.seen)
            await pool.predict("/state", "v", email="s@x.y")
            await asyncio.sleep(0.2)  # the session's heartbeat request goes out
        finally:
            await pool.aclose()
    first = set(rec.ports[: rounds[1]])
    later = set(rec.ports[rounds[1] : stateless])
    assert len(later - first) <= 1, (len(first), sorted(later - first))
    assert not [p for _, p, _ in rec.seen[:stateless] if "/heartbeat/" in p]
    assert [p for _, p, _ in rec.seen[stateless:] if "/heartbeat/" in p]


def _app(heartbeat: bool, components: list[dict[str, Any]], deps: list[dict[str, Any]]) -> AppInfo:
    config = {"protocol": "sse_v3", "connect_heartbeat": heartbeat, "components": components,
              "dependencies": deps}  # fmt: skip
    return AppInfo("http://127.0.0.1:1/", config, {})


def _dep(name: str, inputs: list[int], trigger: str = "click") -> dict[str, Any]:
    return {"api_name": name, "inputs": inputs, "outputs": [1], "targets": [[9, trigger]]}


def test_the_heartbeat_rule_follows_what_the_stream_s_end_does() -> None:
    """A State app: only the endpoint touching the State holds a heartbeat; an app with an
    unload listener, or whose flag has no visible cause, holds one for every session;
    no flag, none."""
    parts = [{"id": 1, "type": "textbox"}, {"id": 2, "type": "state"}]
    stateful = _app(True, parts, [_dep("echo", [1]), _dep("state", [1, 2])])
    assert not stateful.endpoint("/echo").needs_heartbeat
    assert stateful.endpoint("/state").needs_heartbeat
    unload = _app(True, parts, [_dep("echo", [1]), _dep("bye", [], "unload")])
    assert unload.endpoint("/echo").needs_heartbeat
    hidden = _app(True, parts[:1], [_dep("echo", [1])])  # e.g. a per-session cache
    assert hidden.endpoint("/echo").needs_heartbeat
    assert not _app(False, parts, [_dep("state", [1, 2])]).endpoint("/state").needs_heartbeat
