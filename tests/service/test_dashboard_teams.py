"""The dashboard's truth under load (issue 32), in a real headless Chromium against a
real service: live waits (the oldest and the p95 of the waits still queued, where the
finished-wait percentiles say almost nothing), each Space's last error and last health
check with their time, and the API keys' usage (a plot per key, the top users).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from devspaces import SpaceFleet

from .conftest import ServiceFactory, ServiceProcess, admin_headers
from .test_dashboard import api_stats, browser, open_dashboard, read_view, until  # noqa: F401

HOLD_S = 4.0


@pytest.fixture(scope="module")
def service(start_service: ServiceFactory) -> ServiceProcess:
    """Global cap 1 (so calls queue), health rounds every second."""
    return start_service(
        POOL_GLOBAL_MAX_CONCURRENT="1",
        POOL_QUEUE_TIMEOUT_S="30",
        POOL_HEALTH_INTERVAL_S="1",
        POOL_MIN_CONNECTIONS="1",
    )


def _text(view: dict[str, Any], *path: str) -> str:
    return str(view["stats"][json.dumps(list(path), separators=(",", ":"))]["text"])


async def test_the_page_shows_live_waits_space_errors_and_health_and_keys_usage(
    browser: Any, service: ServiceProcess, spaces: SpaceFleet, tmp_path: Path  # noqa: F811
) -> None:
    """Five calls queued behind one that holds the only slot for 4 s: the page's
    "Waiting now" shows the waits in progress (oldest over 1 s, p95 over 0) as
    pool-stats does; a failed call shows as its Space's last error with a time; a health
    probe shows with a time; the key's card plots its calls and the top-users table lists
    its users by hash, never by email."""
    space = next(iter(spaces))
    async with service.client(**admin_headers()) as admin:
        created = (await admin.post("/api/admin/keys",
                                    json={"name": "dash-team", "max_concurrent": 8})).json()
    bearer = {"Authorization": f"Bearer {created['key']}"}
    async with service.client(**bearer) as client:
        for who in ("ann", "bob", "ann"):
            done = await client.post("/api/predict", json={
                "api_name": "/echo", "args": [who, 0], "email": f"{who}@example.com",
                "space": space.name})  # fmt: skip
            assert done.status_code == 200
        failed = await client.post("/api/predict", json={"api_name": "/fail", "args": ["x"],
                                                         "space": space.name})  # fmt: skip
        assert failed.status_code == 502
        page = await open_dashboard(browser, service)
        await page.locator("#status[data-state=live]").wait_for()
        hold = asyncio.ensure_future(client.post("/api/predict", json={
            "api_name": "/echo", "args": ["hold", HOLD_S], "space": space.name}))
        queued = [asyncio.ensure_future(client.post("/api/predict", json={
            "api_name": "/echo", "args": [f"q{n}", 0], "space": space.name,
            "email": f"q{n}@example.com"})) for n in range(5)]  # fmt: skip
        await until(page, """() => Number(document.querySelector(
            '[data-stat=\\'["admission","liveWaits","oldestMs"]\\']').textContent) > 1000""",
            "the oldest live wait passes 1 s on the page")  # fmt: skip
        view = await read_view(page)
        await page.screenshot(path=str(tmp_path / "dashboard-live-waits.png"), full_page=True)
        stats = await api_stats(service)
        answers = await asyncio.gather(hold, *queued)
    assert [a.status_code for a in answers] == [200] * 6
    assert int(_text(view, "admission", "liveWaits", "count")) >= 4
    assert float(_text(view, "admission", "liveWaits", "p95Ms")) > 0
    assert stats["admission"]["liveWaits"]["count"] >= 4

    await until(page, """() => {
        const card = document.querySelector('#keys [data-key="dash-team"]');
        return card && Number(card.dataset.calls) === 10
            && document.querySelectorAll('#top-users tr').length >= 3; }""",
        "the key's usage reaches the page", 30)  # fmt: skip
    await until(page, f"""() => {{
        const card = [...document.querySelectorAll('#spaces .space')]
            .find((c) => c.dataset.space === {json.dumps(space.name)});
        const probe = card.querySelector('[data-field=\\'["lastProbe","at"]\\']');
        return probe.getAttribute('datetime') !== null; }}""",
        "a health probe with its time on the Space's card", 30)  # fmt: skip
    view = await read_view(page)
    name = space.name
    assert _text(view, "pools", name, "lastFailure", "kind") == "app_error"
    assert view["stats"][json.dumps(["pools", name, "lastFailure", "at"],
                                    separators=(",", ":"))]["datetime"]  # fmt: skip
    assert _text(view, "pools", name, "lastProbe", "result") == "ok"
    plot = page.locator('#keys [data-key="dash-team"] svg.key-chart')
    assert int(await plot.get_attribute("data-points") or 0) >= 1
    assert await plot.locator("rect.calls").count() >= 1
    assert await plot.locator("path.space").get_attribute("d")
    rows = await page.locator("#top-users tr").all_inner_texts()
    assert any("dash-team" in row for row in rows)
    await page.screenshot(path=str(tmp_path / "dashboard-keys.png"), full_page=True)
    content = await page.content()
    assert "@example.com" not in content and created["key"] not in content
