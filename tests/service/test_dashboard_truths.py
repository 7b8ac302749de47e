"""The dashboard tells the truth (issue 41), in a real headless Chromium against a real
service: a revoked key is marked, calls without a key are not counted as a key, the
health checks say when the first runs, the queue chart's caption names the span its axis
shows, and every figure is explained on hover. Screenshots go to the test's tmp_path
(named in the failure) when an assertion fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devspaces import SpaceFleet

from .conftest import ServiceFactory, ServiceProcess, admin_headers
from .test_dashboard import browser, open_dashboard, until  # noqa: F401

TRUTHS = """() => {
  const cards = [...document.querySelectorAll('#keys .card.key')];
  const untitled = [...document.querySelectorAll('#dashboard [data-stat]')]
    .filter((el) => !el.title).map((el) => el.dataset.stat);
  return {
    count: document.getElementById('key-count').textContent,
    keys: cards.map((c) => ({key: c.dataset.key, revoked: c.dataset.revoked === 'true',
                             title: c.querySelector('h3').textContent.trim()})),
    health: document.getElementById('health-age').textContent,
    next: document.querySelector('[data-stat=\\'["nextHealthCheck"]\\']').getAttribute('datetime'),
    span: document.getElementById('queue-span').textContent,
    caption: document.getElementById('queue-caption').textContent,
    untitled,
    lastErrorTitle: document.querySelector('#spaces [data-field=\\'["lastError"]\\']').title,
  };
}"""


@pytest.fixture(scope="module")
def service(start_service: ServiceFactory) -> ServiceProcess:
    """The default health interval (300 s): no round has run while the test looks."""
    return start_service(POOL_MIN_CONNECTIONS="1")


async def test_revoked_keys_marked_keyless_calls_not_keys_health_next_and_hover_texts(
    browser: Any,  # noqa: F811
    service: ServiceProcess,
    spaces: SpaceFleet,
    tmp_path: Path,
) -> None:
    """Two keys (one then revoked) and a call without a key: the count says 2 keys, 1
    revoked; the revoked key's card is marked; the keyless card is named as such; before
    the first health round the card says "none yet · next at …" (pool-stats'
    nextHealthCheck); the chart's caption names its axis span; every figure has a title."""
    space = next(iter(spaces))
    async with service.client(**admin_headers()) as admin:
        made = [(await admin.post("/api/admin/keys", json={"name": n, "max_concurrent": 2}))
                .json() for n in ("team-live", "team-gone")]  # fmt: skip
    body = {"api_name": "/echo", "args": ["x", 0], "space": space.name}
    async with service.client() as client:
        for key in made:
            bearer = {"Authorization": f"Bearer {key['key']}"}
            answer = await client.post("/api/predict", json=body, headers=bearer)
            assert answer.status_code == 200, answer.text
        assert (await client.post("/api/predict", json=body)).status_code == 200  # no key
    async with service.client(**admin_headers()) as admin:
        assert (await admin.delete(f"/api/admin/keys/{made[1]['id']}")).status_code == 204
        listed = (await admin.get("/api/admin/keys")).json()["keys"]
        gone = next(k for k in listed if k["id"] == made[1]["id"])
        assert gone["revoked"] is True and gone["revoked_at"].endswith("Z")
        stats = (await admin.get("/api/admin/pool-stats")).json()
    assert stats["lastHealthCheck"] is None and stats["nextHealthCheck"].endswith("Z")

    page = await open_dashboard(browser, service)
    try:
        await page.locator("#status[data-state=live]").wait_for()
        await until(page, "() => document.querySelectorAll('#keys .card.key').length >= 3",
                    "the keys' usage reaches the page", 30)  # fmt: skip
        seen = await page.evaluate(TRUTHS)
        assert seen["count"] == "(2 keys, 1 revoked)", seen
        by_key = {k["key"]: k for k in seen["keys"]}
        assert by_key["team-gone"]["revoked"] and "revoked" in by_key["team-gone"]["title"]
        assert not by_key["team-live"]["revoked"]
        assert by_key["no key"]["title"].startswith("no key (callers without an API key)")
        assert seen["health"].startswith("none yet · next at "), seen
        assert seen["next"] == stats["nextHealthCheck"].replace(".000000", "")
        minutes = seen["span"].strip("−").split()[0]
        assert f"over the last {minutes} minutes" in seen["caption"], seen
        assert seen["untitled"] == [], seen["untitled"]
        assert "routing around" in seen["lastErrorTitle"], seen
    except AssertionError:
        shot = tmp_path / "dashboard-truths.png"
        await page.screenshot(path=str(shot), full_page=True)
        print(f"\nscreenshot: {shot}\n{json.dumps(await page.evaluate(TRUTHS), indent=1)}")
        raise
