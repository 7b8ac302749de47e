"""What a Space serves without admission (Pool.space_*): read beside the calls, never
by checking out a connection (the Gradio front's config, API info and files)."""

from __future__ import annotations

import asyncio

import pytest

from devspaces import SpaceFleet
from pool import UnknownSpace
from tests.conftest import PoolMaker


async def test_space_reads_take_no_connection_and_no_slot(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """With the Space's only connection leased, its app, API info and files are still
    read at once, and nothing more is leased or opened for them."""
    pool = make_pool(clean_fleet, min_connections=1, max_connections=1)
    async with pool.client(space="alpha") as held:
        app = await asyncio.wait_for(pool.space_app("alpha"), 5)
        status, info = await asyncio.wait_for(pool.space_info("alpha", {}), 5)
        async with pool.space_file("alpha", "no/such/file.txt") as missing:
            assert missing is None
        stats = (await pool.stats())["pools"]["alpha"]
        assert stats["inUseConnections"] == 1, "only the call's own connection"
        assert stats["totalConnections"] == 1, "none opened for the reads"
        assert held.api_names == app.api_names()
    assert "/echo" in app.api_names() and app.app_id is not None
    assert status == 200 and "/echo" in info["named_endpoints"]
    with pytest.raises(UnknownSpace):
        await pool.space_app("nowhere")


async def test_a_spaces_web_page_and_files_are_read_without_a_slot(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """Pool.space_web (the Gradio front's pages): the Space's page and a file it loads,
    read with its only connection leased; a missing file is the Space's 404."""
    pool = make_pool(clean_fleet, min_connections=1, max_connections=1)
    async with pool.client(space="alpha"):
        async with pool.space_web("alpha", "") as page:
            await asyncio.wait_for(page.aread(), 10)
        async with pool.space_web("alpha", "theme.css") as theme:
            await theme.aread()
        async with pool.space_web("alpha", "assets/no-such-file.js") as missing:
            assert missing.status_code == 404
        assert (await pool.stats())["pools"]["alpha"]["totalConnections"] == 1
    assert page.status_code == 200 and "window.gradio_config" in page.text
    assert theme.status_code == 200 and theme.headers["content-type"].startswith("text/css")
