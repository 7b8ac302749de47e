"""Discovery through the HTTP service: GET /api/spaces lists every configured Space with
its state from pool-stats, and GET /api/spaces/{name}/api gives each Space's endpoints
exactly as gradio_client's ``view_api(return_format="dict")`` does — checked for one
stand-in Space of every kind in ``devspaces._kinds.KINDS``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from gradio_client import Client

from devspaces import SpaceFleet, SpaceProcess
from devspaces._kinds import KINDS

from .conftest import ServiceFactory, ServiceProcess, admin_headers


@pytest.fixture(scope="module")
def kind_spaces(every_kind: SpaceFleet) -> dict[str, SpaceProcess]:
    """One stand-in Space per kind, named after its kind (the session's, shared with
    test_conformance, which only calls them too)."""
    return {kind: every_kind[kind] for kind in KINDS}


@pytest.fixture(scope="module")
def service(start_service: ServiceFactory, kind_spaces: dict[str, SpaceProcess]) -> ServiceProcess:
    spaces = ",".join(f"{s.name}={s.url}" for s in kind_spaces.values())
    return start_service(POOL_SPACES=spaces)


def view_api(url: str) -> dict[str, Any]:
    """What a plain Client says about the Space, as JSON would carry it."""
    client = Client(url, verbose=False, download_files=False)
    try:
        info: dict[str, Any] = client.view_api(return_format="dict", print_info=False)
    finally:
        client.close()
    return dict(json.loads(json.dumps(info)))


async def assert_listing_matches_view_api(
    http: httpx.AsyncClient, name: str, space: SpaceProcess
) -> dict[str, Any]:
    """GET /api/spaces/{name}/api equals Client.view_api(return_format="dict") (any kind)."""
    response = await http.get(f"/api/spaces/{name}/api")
    assert response.status_code == 200, response.text
    listing: dict[str, Any] = response.json()
    expected = view_api(space.url)
    assert listing["named_endpoints"] == expected["named_endpoints"]
    assert listing["unnamed_endpoints"] == expected["unnamed_endpoints"]
    assert listing["space"] == name and listing["app_id"] == space.app_id
    return listing


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_the_endpoint_listing_matches_view_api_for_every_kind(
    kind: str, service: ServiceProcess, kind_spaces: dict[str, SpaceProcess]
) -> None:
    """Each kind's listing is view_api's, with parameter names, types and defaults."""
    space = kind_spaces[kind]
    async with service.client() as http:
        listing = await assert_listing_matches_view_api(http, space.name, space)
    for endpoint in listing["named_endpoints"].values():
        for parameter in endpoint["parameters"]:
            assert {"parameter_name", "parameter_has_default", "python_type"} <= set(parameter)


async def test_the_echo_listing_names_its_parameters_and_defaults(
    service: ServiceProcess, kind_spaces: dict[str, SpaceProcess]
) -> None:
    """/echo takes text and delay_s (default 0): enough to build a request without the UI."""
    async with service.client() as http:
        listing = (await http.get("/api/spaces/echo/api")).json()
    params = listing["named_endpoints"]["/echo"]["parameters"]
    assert [p["parameter_name"] for p in params] == ["text", "delay_s"]
    assert params[1]["parameter_has_default"] and params[1]["parameter_default"] == 0
    assert "/fail" in listing["named_endpoints"]


async def test_spaces_are_listed_with_the_state_pool_stats_reports(
    service: ServiceProcess, kind_spaces: dict[str, SpaceProcess]
) -> None:
    """GET /api/spaces: every configured Space, its state and figures equal to pool-stats."""
    async with service.client() as http:
        await http.post("/api/predict", json={"space": "echo", "api_name": "/echo",
                                              "args": ["hi", 0]})  # fmt: skip
        listed = (await http.get("/api/spaces")).json()["spaces"]
        stats = (await http.get("/api/admin/pool-stats", headers=admin_headers())).json()
    names = [entry["name"] for entry in listed]
    assert names == [space.name for space in kind_spaces.values()]
    for entry in listed:
        pool = stats["pools"][entry["name"]]
        assert entry["state"] == "up" and entry["up"] is True
        assert entry["breaker"] == pool["breaker"]["state"] == "closed"
        assert entry["window"] == pool["window"]["current"]
        assert entry["api_url"] == f"/api/spaces/{entry['name']}/api"
    echo = next(entry for entry in listed if entry["name"] == "echo")
    assert echo["connections"]["total"] >= 1


async def test_an_unknown_space_is_422_naming_the_configured_ones(
    service: ServiceProcess, kind_spaces: dict[str, SpaceProcess]
) -> None:
    """Unknown name: 422 unknown_space (as a predict's "space"); a bad name shape: 422 too."""
    async with service.client() as http:
        response = await http.get("/api/spaces/nope/api")
        assert response.status_code == 422
        body = response.json()
        assert body["error"] == "unknown_space"
        assert set(body["available"]) == {s.name for s in kind_spaces.values()}
        bad = await http.get("/api/spaces/%20bad%24/api")
        assert bad.status_code == 422 and bad.json()["error"] == "invalid_body"
