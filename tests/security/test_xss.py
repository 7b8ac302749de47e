"""Finding 4 of the trust-boundary issue: an HTML or SVG file uploaded to the front,
opened in Chromium (embedded in the service's own page and as a page of its own),
runs no script on the service's origin (where the dashboard keeps its admin token).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from devspaces import SpaceProcess
from tests.service.conftest import ADMIN_TOKEN, ServiceProcess, service_env


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    folder = tmp_path_factory.mktemp("xss")
    with SpaceProcess("talker") as talker:
        started = ServiceProcess(service_env(f"talker={talker.url}", folder),
                                 folder / "service.log")  # fmt: skip
        yield started
        started.stop()


async def test_an_uploaded_page_runs_no_script_on_the_services_origin(
    service: ServiceProcess, browser: Any
) -> None:
    pages = {
        "x.html": b"<html><body><script>localStorage.setItem('pwned', 'html')</script>"
        b"</body></html>",
        "x.svg": b'<svg xmlns="http://www.w3.org/2000/svg" onload="localStorage.setItem('
        b"'pwned', 'svg')\"><script>localStorage.setItem('pwned', 'svg')</script></svg>",
    }
    async with service.client() as client:
        urls = []
        for name, body in pages.items():
            (path,) = (await client.post("/gradio/talker/gradio_api/upload",
                                         files={"files": (name, body)})).json()  # fmt: skip
            urls.append(f"{service.url}/gradio/talker/gradio_api/file={path}")
    page = await browser.new_page()
    await page.goto(f"{service.url}/admin")
    await page.evaluate(f"sessionStorage.setItem('token', '{ADMIN_TOKEN}')")
    for url in urls:
        # Embedded from the service's own page, and opened as a page of its own.
        await page.evaluate("""url => { const f = document.createElement('iframe');
            f.src = url; document.body.appendChild(f);
            const o = document.createElement('object'); o.data = url;
            document.body.appendChild(o); }""", url)  # fmt: skip
        tab = await browser.new_page()
        with contextlib.suppress(Exception):  # a download, not a page: nothing rendered
            await tab.goto(url)
        await tab.close()
    await asyncio.sleep(2.0)
    assert await page.evaluate("localStorage.getItem('pwned')") is None
