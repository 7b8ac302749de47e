"""The admin dashboard, ``GET /admin``: a real headless Chromium (Debian's, driven by
Playwright) against a real uvicorn service over real stand-in Spaces.

The page must show nothing from the pool without the admin token, follow load within
a couple of polls (in-use bars, queue chart), say every figure exactly as
``/api/admin/pool-stats`` says it, mark itself stale when updates stop, and stay usable
by keyboard and at phone width. The rolling activity behind the extra pool-stats keys
(:mod:`app.admin._history`) is checked on its own with a fake clock.

Without Chromium (or the playwright package) the browser tests skip with the reason;
with ``CI=true`` they fail instead, so CI cannot pass without running them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import time
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from app.admin._history import MAX_CLASSES, RATE_S, SAMPLE_S, WINDOW_S, Activity
from devspaces import SpaceFleet
from pool import PoolEvent

from .conftest import ADMIN_TOKEN, ServiceFactory, ServiceProcess, admin_headers, eventually

CHROMIUM = Path(os.environ.get("SPACEPOOL_CHROMIUM", "/usr/bin/chromium"))
# This machine's network is closed: without these Chromium waits on refused connections.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DASH = "—"
GLOBAL_CAP = 2
MAX_CONNECTIONS = 6
LOAD_REQUESTS = 8
LOAD_DELAY_S = 2.0
READ_VIEW = """() => {
  const stats = {};
  for (const el of document.querySelectorAll("#dashboard [data-stat]")) {
    stats[el.dataset.stat] = {
      text: el.textContent, kind: el.dataset.kind || "", datetime: el.getAttribute("datetime"),
    };
  }
  const bars = [];
  for (const bar of document.querySelectorAll("#spaces [data-bar]")) {
    bars.push({
      space: bar.closest("[data-space]").dataset.space, key: bar.dataset.bar,
      value: Number(bar.dataset.value), max: Number(bar.getAttribute("aria-valuemax")),
    });
  }
  const chart = document.getElementById("queue-chart");
  return {
    renders: Number(document.body.dataset.renders),
    stats, bars,
    spaces: [...document.querySelectorAll("#spaces [data-space]")].map((c) => c.dataset.space),
    peak: Number(chart.dataset.peak), points: Number(chart.dataset.points),
    cap: Number(document.getElementById("cap-bar").dataset.value),
  };
}"""


# -- the browser, or a plain reason why not ------------------------------------------------
def in_ci(env: Mapping[str, str]) -> bool:
    return env.get("CI", "").strip().lower() in {"1", "true", "yes"}


def require_browser(chromium: Path = CHROMIUM, env: Mapping[str, str] = os.environ) -> None:
    """Skip (or, under CI, fail) with a plain reason when Chromium or playwright is missing."""
    missing = []
    if not (chromium.is_file() and os.access(chromium, os.X_OK)):
        missing.append(f"{chromium} is missing (install it: apt-get install -y chromium)")
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright package is missing (pip install -e '.[test]')")
    if not missing:
        return
    reason = "the dashboard browser test needs Debian's Chromium: " + "; ".join(missing)
    if in_ci(env):
        pytest.fail(f"{reason}. CI=true: this must run in CI, so it fails, not skips", False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def service(start_service: ServiceFactory) -> ServiceProcess:
    """Global cap 2 and at most 6 connections per Space, so load queues and shows."""
    return start_service(
        POOL_GLOBAL_MAX_CONCURRENT=str(GLOBAL_CAP),
        POOL_MAX_CONNECTIONS=str(MAX_CONNECTIONS),
        POOL_MIN_CONNECTIONS="2",
        POOL_QUEUE_TIMEOUT_S="30",
    )


_told: set[str] = set()


def tell(config: pytest.Config, text: str) -> None:
    """Print ``text`` once on the terminal, even under ``-q`` (a skip reason is hidden)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or text in _told:
        return
    _told.add(text)
    with capture.global_and_fixture_disabled():
        reporter.write_line(f"\nNOTE: {text}", yellow=True)


@pytest.fixture
async def browser(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """A fresh headless Chromium profile (Debian's binary; Playwright never downloads one)."""
    try:
        require_browser()
    except pytest.skip.Exception as skipped:
        tell(request.config, f"browser tests skipped: {skipped.msg}")
        raise
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
            service_workers="block",
        )
        context.set_default_timeout(20_000)
        try:
            yield context
        finally:
            await context.close()


# -- what the page should say ----------------------------------------------------------------
_MISSING = object()


def lookup(stats: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(stats, dict) or key not in stats:
            return _MISSING
        stats = stats[key]
    return stats


def shown(value: Any, kind: str) -> str:
    """The text the page gives a value (admin.js ``format``), for comparison."""
    if value is _MISSING or value is None or isinstance(value, dict | list):
        return DASH
    if kind == "time":
        return "<time>"  # compared through the datetime attribute
    if kind == "updown" and isinstance(value, bool):
        return "up" if value else "down"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def expected_view(view: dict[str, Any], stats: dict[str, Any]) -> dict[str, Any]:
    """What ``view`` (the page, read by READ_VIEW) must hold for ``stats``."""
    texts = {}
    for key, el in view["stats"].items():
        value = lookup(stats, json.loads(key))
        if el["kind"] == "time" and value not in (_MISSING, None):
            texts[key] = ("<time>", value)
        else:
            texts[key] = (shown(value, el["kind"]), None)
    pools = stats["pools"]
    return {
        "texts": texts,
        "spaces": sorted(pools),
        "errors": {name: sorted(entry.get("errors", {})) for name, entry in pools.items()},
        "bars": sorted(
            (name, key, entry[key], entry["maxConnections"])
            for name, entry in pools.items()
            for key in ("inUseConnections", "availableConnections", "unhealthyConnections")
        ),
        "cap": stats["admission"]["globalInUse"],
    }


def actual_view(view: dict[str, Any]) -> dict[str, Any]:
    texts = {}
    for key, el in view["stats"].items():
        if el["kind"] == "time" and el["text"] != DASH:
            texts[key] = ("<time>", el["datetime"])
        else:
            texts[key] = (el["text"], None)
    errors: dict[str, list[str]] = {name: [] for name in view["spaces"]}
    for key in view["stats"]:
        path = json.loads(key)
        if path[0] == "pools" and len(path) == 4 and path[2] == "errors":
            errors[path[1]].append(path[3])
    return {
        "texts": texts,
        "spaces": view["spaces"],
        "errors": {name: sorted(classes) for name, classes in errors.items()},
        "bars": sorted((b["space"], b["key"], b["value"], b["max"]) for b in view["bars"]),
        "cap": view["cap"],
    }


def assert_page_says(view: dict[str, Any], stats: dict[str, Any]) -> None:
    """Every figure on the page equals the stats, key by key."""
    expected, actual = expected_view(view, stats), actual_view(view)
    wrong = {
        key: (actual["texts"].get(key), want)
        for key, want in expected["texts"].items()
        if actual["texts"].get(key) != want
    }
    assert not wrong, f"page differs from pool-stats (page, api): {wrong}"
    for part in ("spaces", "errors", "bars", "cap"):
        assert actual[part] == expected[part], part


async def read_view(page: Any) -> dict[str, Any]:
    view: dict[str, Any] = await page.evaluate(READ_VIEW)
    return view


async def api_stats(service: ServiceProcess) -> dict[str, Any]:
    async with service.client(**admin_headers()) as client:
        response = await client.get("/api/admin/pool-stats")
    assert response.status_code == 200, response.text
    stats: dict[str, Any] = response.json()
    return stats


async def open_dashboard(browser: Any, service: ServiceProcess, token: str = ADMIN_TOKEN) -> Any:
    """A page on /admin with ``token`` entered through the form."""
    page = await browser.new_page()
    await page.goto(f"{service.url}/admin")
    await page.get_by_label("Admin token").fill(token)
    await page.get_by_role("button", name="Show the pool").click()
    return page


async def until(page: Any, predicate: str, what: str, timeout_s: float = 20) -> None:
    """Poll a JS predicate in the page (the page's CSP forbids wait_for_function's eval)."""

    async def holds() -> bool:
        return bool(await page.evaluate(predicate))

    await eventually(holds, timeout_s, what, every_s=0.1)


async def wait_renders(page: Any, count: int) -> None:
    await until(page, f"() => Number(document.body.dataset.renders) >= {count}", "page render")


# -- tests -----------------------------------------------------------------------------------
async def test_the_page_and_its_assets_are_static_locked_down_and_carry_no_pool_data(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """/admin and its assets answer without auth but hold no pool data; pool-stats refuses."""
    async with service.client() as client:
        page = await client.get("/admin")
        script = await client.get("/admin/assets/admin.js")
        style = await client.get("/admin/assets/admin.css")
        unknown = await client.get("/admin/assets/..%2F_api.py")
        refused = await client.get("/api/admin/pool-stats")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "form-action 'none'" in csp
    assert page.headers["referrer-policy"] == "no-referrer"
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert style.status_code == 200 and "css" in style.headers["content-type"]
    assert unknown.status_code == 404
    assert refused.status_code == 401
    for name in (space.name for space in spaces):
        assert name not in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing from elsewhere


def test_activity_counts_per_minute_and_per_class_within_bounded_windows() -> None:
    """Requests per minute cover 60 s, error classes 15 min; classes and samples are bounded."""
    now = [1000.0]
    wall = [datetime(2024, 1, 20, 10, 0, tzinfo=UTC)]
    activity = Activity(clock=lambda: now[0], wall=lambda: wall[0])
    for outcome in ("ok", "ok", "app_error", "transport"):
        activity.on_event(PoolEvent("finished", "alpha", outcome, 0.1))
    activity.on_event(PoolEvent("busy", "beta", "queue_timeout"))
    activity.on_event(PoolEvent("admitted", "alpha", None, 0.1))  # not a request outcome
    assert activity.summary() == {
        "alpha": {"requests": 4, "errors": {"app_error": 1, "transport": 1}},
        "beta": {"requests": 1, "errors": {"busy": 1}},
    }
    now[0] += RATE_S
    alpha = activity.summary()["alpha"]
    assert alpha == {"requests": 0, "errors": {"app_error": 1, "transport": 1}}
    now[0] += WINDOW_S
    assert activity.summary() == {}
    for n in range(MAX_CLASSES + 5):
        activity.on_event(PoolEvent("finished", "alpha", f"kind{n}", 0.1))
    assert len(activity.summary()["alpha"]["errors"]) == MAX_CLASSES + 1  # + "other"
    for n in range(2 * int(WINDOW_S / SAMPLE_S)):
        wall[0] += timedelta(seconds=SAMPLE_S)
        activity.record_queue(n)
    assert len(activity.queue) == int(WINDOW_S / SAMPLE_S)
    assert activity.queue[-1] == (wall[0].isoformat().replace("+00:00", "Z"), n)


def test_a_missing_chromium_skips_with_the_reason_and_fails_under_ci(tmp_path: Path) -> None:
    """No Chromium: a skip that says what to install; with CI=true, a failure instead."""
    nowhere = tmp_path / "no-chromium"
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y chromium"):
        require_browser(nowhere, {})
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_browser(nowhere, {"CI": "true"})


async def test_without_the_token_the_page_shows_nothing_from_the_pool(
    browser: Any, service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """No token: no stats request, nothing shown; a wrong one is refused and forgotten."""
    names = [space.name for space in spaces]
    requested: list[str] = []
    page = await browser.new_page()
    page.on("request", lambda request: requested.append(request.url))
    await page.goto(f"{service.url}/admin")
    await page.get_by_label("Admin token").wait_for()
    assert not any("pool-stats" in url for url in requested)
    assert await page.locator("#dashboard").is_hidden()

    await page.get_by_label("Admin token").fill("wrong-token-7d0e")
    await page.get_by_label("Admin token").press("Enter")
    error = page.get_by_role("alert")
    await error.wait_for()
    assert "refused" in await error.inner_text()
    assert any("pool-stats" in url for url in requested)
    assert await page.locator("#dashboard").is_hidden()
    assert await page.evaluate("sessionStorage.length") == 0
    assert page.url == f"{service.url}/admin"
    content = await page.content()
    assert not [name for name in names if name in content]

    await page.get_by_label("Admin token").fill(ADMIN_TOKEN)
    await page.get_by_role("button", name="Show the pool").click()
    await page.locator("#spaces [data-space]").first.wait_for()
    await page.get_by_role("button", name="Forget token").click()
    await page.get_by_label("Admin token").wait_for()
    content = await page.content()
    assert not [name for name in names if name in content]
    assert ADMIN_TOKEN not in content
    assert not any(ADMIN_TOKEN in url for url in requested)
    async with service.client() as client:
        assert (await client.get("/api/admin/pool-stats")).status_code == 401


async def test_the_page_follows_load_and_says_what_pool_stats_says(
    browser: Any, service: ServiceProcess, spaces: SpaceFleet, tmp_path: Path
) -> None:
    """Under load the in-use bars and queue chart move; every figure equals pool-stats."""
    started = time.monotonic()
    responses: list[Any] = []
    urls: list[str] = []
    page = await browser.new_page()
    page.on("request", lambda request: urls.append(request.url))
    page.on(
        "response",
        lambda r: responses.append(r) if "pool-stats" in r.url and r.status == 200 else None,
    )
    await page.goto(f"{service.url}/admin")
    await page.get_by_label("Admin token").fill(ADMIN_TOKEN)
    await page.get_by_role("button", name="Show the pool").click()
    await page.locator("#status[data-state=live]").wait_for()
    before = await read_view(page)
    assert sorted(before["spaces"]) == sorted(space.name for space in spaces)

    async def rendered(view: dict[str, Any]) -> dict[str, Any]:
        """The pool-stats body the page had rendered when ``view`` was read."""

        async def seen() -> bool:
            return len(responses) >= view["renders"]

        await eventually(seen, 10, "the rendered response reaches the test")
        body: dict[str, Any] = await responses[view["renders"] - 1].json()
        return body

    async with service.client() as client:
        failing = asyncio.ensure_future(
            client.post("/api/predict", json={"api_name": "/fail", "args": ["boom"]})
        )
        load = [
            asyncio.ensure_future(
                client.post(
                    "/api/predict",
                    json={
                        "email": f"dash-user-{n}@example.com",
                        "api_name": "/echo",
                        "args": [f"load {n}", LOAD_DELAY_S],
                    },
                )
            )
            for n in range(LOAD_REQUESTS)
        ]
        await until(
            page,
            """() => [...document.querySelectorAll('#spaces [data-bar=inUseConnections]')]
                     .some((bar) => Number(bar.dataset.value) > 0)
                  && Number(document.getElementById('queue-chart').dataset.peak) > 0""",
            "in-use bars and the queue chart move",
        )
        busy = await read_view(page)
        await page.screenshot(path=str(tmp_path / "dashboard-under-load.png"), full_page=True)
        assert_page_says(busy, await rendered(busy))  # exact, with the pool busy
        answers = await asyncio.gather(failing, *load)
    assert answers[0].status_code == 502
    assert [a.status_code for a in answers[1:]] == [200] * LOAD_REQUESTS

    assert max(b["value"] for b in busy["bars"] if b["key"] == "inUseConnections") > 0
    assert busy["peak"] > before["peak"] and busy["points"] > 0
    body = await rendered(busy)
    assert busy["peak"] == max(n for _, n in body["queueHistory"])
    assert busy["points"] == len(body["queueHistory"])
    assert await page.locator("#queue-chart path.line").get_attribute("d")

    # At rest: the page equals pool-stats fetched just before and just after its own fetch.
    deadline = time.monotonic() + 20
    while True:
        first = await api_stats(service)
        shown_now = (await read_view(page))["renders"]
        await wait_renders(page, shown_now + 2)  # a poll that began after `first`
        view = await read_view(page)
        second = await api_stats(service)
        if expected_view(view, first) == expected_view(view, second):
            break
        assert time.monotonic() < deadline, "pool-stats never held still for one poll"
    assert_page_says(view, second)
    texts = actual_view(view)["texts"]
    errors_shown = {k: v for k, v in texts.items() if '"errors"' in k and '"pools"' in k}
    assert errors_shown, "the failed predict shows as an error class"
    assert texts['["userAssignments"]'][0] != "0"
    assert any(
        texts[json.dumps(["pools", name, "requestsPerMinute"], separators=(",", ":"))][0] != "0"
        for name in view["spaces"]
    )
    await page.screenshot(path=str(tmp_path / "dashboard-at-rest.png"), full_page=True)

    content = await page.content()
    assert "@example.com" not in content and ADMIN_TOKEN not in content
    assert not any(ADMIN_TOKEN in url for url in urls)
    assert ADMIN_TOKEN not in service.log_text()
    assert time.monotonic() - started < 60


async def test_the_page_marks_itself_stale_and_works_by_keyboard_and_on_a_phone(
    browser: Any, service: ServiceProcess, spaces: SpaceFleet, tmp_path: Path
) -> None:
    """Stopped updates show "stale" until they resume; Tab reaches everything; 390 px fits."""
    page = await open_dashboard(browser, service)
    status = page.locator("#status")
    await page.locator("#status[data-state=live]").wait_for()

    await page.route("**/api/admin/pool-stats", lambda route: route.abort())
    await page.locator("#status[data-state=stale]").wait_for()
    assert await page.locator("#stale-banner").is_visible()
    assert "Stale" in await status.inner_text()
    await page.screenshot(path=str(tmp_path / "dashboard-stale.png"), full_page=True)
    await page.unroute("**/api/admin/pool-stats")
    await page.locator("#status[data-state=live]").wait_for()
    assert await page.locator("#stale-banner").is_hidden()

    # The token survives a reload of the tab (session storage), and is not re-asked.
    await page.reload()
    await page.locator("#status[data-state=live]").wait_for()
    assert await page.locator("#login").is_hidden()

    reached: list[str] = []
    for _ in range(40):
        await page.keyboard.press("Tab")
        reached.append(
            await page.evaluate(
                """() => { const el = document.activeElement;
                  return el.id || el.dataset.space || el.tagName.toLowerCase(); }"""
            )
        )
    space_names = [space.name for space in spaces]
    assert "forget" in reached
    assert set(space_names) <= set(reached), reached
    assert "summary" in reached  # the queue chart's table
    label = await page.locator("#queue-chart").get_attribute("aria-labelledby")
    span = (await page.locator("#queue-span").inner_text()).strip("−").split()[0]
    caption = await page.locator(f"#{label}").inner_text()
    assert f"over the last {span} minutes" in caption, caption  # the axis's span
    for bar in await page.locator("#spaces [data-bar]").all():
        assert await bar.get_attribute("aria-valuetext")

    await page.set_viewport_size({"width": 390, "height": 844})
    renders = (await read_view(page))["renders"]
    await wait_renders(page, renders + 1)
    overflow = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"{overflow} px wider than a phone"
    assert await page.locator(f"[data-space='{space_names[0]}']").is_visible()
    await page.screenshot(path=str(tmp_path / "dashboard-phone.png"), full_page=True)


async def test_pool_stats_has_the_activity_keys_the_page_reads(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """pool-stats carries requests per minute and error classes per Space, and queue history."""
    async with service.client() as client:
        ok = await client.post("/api/predict", json={"api_name": "/echo", "args": ["x", 0]})
        assert ok.status_code == 200
    stats = await api_stats(service)
    for entry in stats["pools"].values():
        assert isinstance(entry["requestsPerMinute"], int)
        assert isinstance(entry["errors"], dict)
    assert sum(entry["requestsPerMinute"] for entry in stats["pools"].values()) >= 1
    assert stats["activity"]["requestsPerMinute"] >= 1
    history = stats["queueHistory"]
    assert history and all(isinstance(n, int) and at.endswith("Z") for at, n in history)


async def test_every_worker_reports_the_fleet_s_requests_per_minute(
    start_service: ServiceFactory, spaces: SpaceFleet
) -> None:
    """With two workers, whichever answers pool-stats counts the requests both served."""
    service = start_service(workers=2)

    def pids(path: str) -> set[int]:
        return {line["pid"] for line in service.log_lines() if line.get("path") == path}

    sent = 0
    while len(pids("/api/predict")) < 2:  # new connections until both workers served some
        assert sent < 60, "the kernel never gave the second worker a connection"
        async with service.client() as client:
            answer = await client.post("/api/predict", json={"api_name": "/echo", "args": [1, 0]})
        assert answer.status_code == 200
        sent += 1
    agreeing = 0

    async def every_worker_agrees() -> bool:
        nonlocal agreeing
        async with service.client(**admin_headers()) as client:
            stats = (await client.get("/api/admin/pool-stats")).json()
        per_space = sum(entry["requestsPerMinute"] for entry in stats["pools"].values())
        fleet = stats["activity"]["requestsPerMinute"]
        agreeing = agreeing + 1 if per_space == fleet == sent else 0
        return agreeing >= 8 and len(pids("/api/admin/pool-stats")) == 2

    await eventually(every_worker_agrees, 20, "every worker counts the fleet", every_s=0.05)
