"""A page's visitors are pseudonyms anyone can mint (a page loaded without the cookie gives a
new one), so together they are the anonymous callers: ``POOL_ANONYMOUS_MAX_CONCURRENT``
bounds them all, while users a proxy names (``X-Spacepool-User``) are each their own
(issue 42). Measured at the Space, from its own count of calls in flight."""

from __future__ import annotations

import asyncio

import httpx

from devspaces import SpaceFleet
from tests.service.conftest import ServiceFactory


async def _run(client: httpx.AsyncClient, headers: dict[str, str], text: str) -> str:
    """One slow echo through the front's REST API, its result read to the end."""
    made = await client.post("/gradio/alpha/gradio_api/call/echo", headers=headers,
                             json={"data": [text, 1.5]})  # fmt: skip
    assert made.status_code == 200, made.text
    result = await client.get(f"/gradio/alpha/gradio_api/call/echo/{made.json()['event_id']}",
                              headers=headers)  # fmt: skip
    assert result.status_code == 200, result.text
    return result.text


async def test_visitors_share_the_anonymous_slots_named_users_do_not(
    start_service: ServiceFactory, spaces: SpaceFleet
) -> None:
    service = start_service(POOL_GRADIO_PAGES="alpha", POOL_ANONYMOUS_MAX_CONCURRENT="1",
                            POOL_SPACES=f"alpha={spaces['alpha'].url}")  # fmt: skip
    alpha = spaces["alpha"]
    async with service.client() as client:
        cookies = []
        for _ in range(2):  # two browsers: each page load without a cookie mints one
            page = await client.get("/gradio/alpha/", headers={"Accept": "text/html"})
            assert page.status_code == 200, page.text[:200]
            cookies.append(page.cookies["spacepool-visitor"])
            client.cookies.clear()
        assert cookies[0] != cookies[1]
        alpha.reset()
        visitors = [{"Cookie": f"spacepool-visitor={c}"} for c in cookies]
        done = await asyncio.gather(*(_run(client, h, f"v{i}") for i, h in enumerate(visitors)))
        assert all("alpha:v" in text for text in done), done
        assert alpha.stats().peak == 1  # one anonymous slot: the second visitor waited
        alpha.reset()
        named = [{"X-Spacepool-User": f"user{i}@example.com"} for i in range(2)]
        done = await asyncio.gather(*(_run(client, h, f"n{i}") for i, h in enumerate(named)))
        assert all("alpha:n" in text for text in done), done
        assert alpha.stats().peak == 2  # named users: a slot each, at once
