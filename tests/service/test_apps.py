"""Apps over HTTP, against Gradio demo apps that all name their endpoint /predict: a
call without a Space is 422 ambiguous_endpoint (nothing admitted), GET /api/spaces
shows the apps and their replicas, and uploads reach the app under the caller's name
(multipart filename, base64 "name"), two of one name in one call included."""

from __future__ import annotations

import base64
import json

import pytest

from devspaces import SpaceProcess

from .conftest import ServiceFactory, ServiceProcess, admin_headers


@pytest.fixture(scope="module")
def service(start_service: ServiceFactory, demo_spaces: dict[str, SpaceProcess]) -> ServiceProcess:
    entries = ",".join(f"{name}={space.url}" for name, space in demo_spaces.items())
    return start_service(POOL_SPACES=entries, POOL_MIN_CONNECTIONS="1")


async def test_predict_without_a_space_is_ambiguous_and_discovery_shows_the_apps(
    service: ServiceProcess, demo_spaces: dict[str, SpaceProcess]
) -> None:
    """422 ambiguous_endpoint listing the three apps, nothing run or held; GET
    /api/spaces: upper-1 and upper-2 are replicas of one app, each Space names its app."""
    for space in demo_spaces.values():
        space.reset()
    async with service.client() as http:
        answer = await http.post("/api/predict", json={"api_name": "/predict", "args": ["hi"]})
        assert answer.status_code == 422, answer.text
        body = answer.json()
        assert body["error"] == "ambiguous_endpoint" and body["api_name"] == "/predict"
        assert {a["app"]: a["spaces"] for a in body["apps"]} == {
            "upper-1": ["upper-1", "upper-2"], "state": ["state"], "filename": ["filename"],
        }  # fmt: skip
        assert all(s.stats().total == 0 for s in demo_spaces.values())
        stats = (await http.get("/api/admin/pool-stats", headers=admin_headers())).json()
        assert stats["admission"]["globalInUse"] == 0
        listing = (await http.get("/api/spaces")).json()
        named = await http.post(
            "/api/predict", json={"api_name": "/predict", "args": ["hi"], "space": "upper-2"}
        )
    assert {a["app"]: a["replicas"] for a in listing["apps"]} == {
        "upper-1": ["upper-1", "upper-2"], "state": ["state"], "filename": ["filename"],
    }  # fmt: skip
    assert {s["name"]: s["app"] for s in listing["spaces"]} == {
        "upper-1": "upper-1", "upper-2": "upper-1", "state": "state", "filename": "filename",
    }  # fmt: skip
    assert named.status_code == 200 and named.json()["result"] == "upper-2:HI"


async def test_uploads_arrive_under_the_callers_names(service: ServiceProcess) -> None:
    """The app returns each upload's name: notes.txt by multipart filename and by base64
    "name"; two parts both called same.txt both arrive, each with its own bytes."""
    async with service.client() as http:
        body = {"api_name": "/predict", "space": "filename",
                "args": [[{"file": {"upload": "doc"}}]]}  # fmt: skip
        files = {"doc": ("notes.txt", b"by multipart")}
        by_part = await http.post("/api/predict", data={"body": json.dumps(body)}, files=files)
        b64 = base64.b64encode(b"by base64").decode()
        inline = {"api_name": "/predict", "space": "filename",
                  "args": [[{"file": {"b64": b64, "name": "notes.txt"}}]]}  # fmt: skip
        by_b64 = await http.post("/api/predict", json=inline)
        pair = {"api_name": "/predict", "space": "filename",
                "args": [[{"file": {"upload": "x"}}, {"file": {"upload": "y"}}]]}  # fmt: skip
        two = {"x": ("same.txt", b"first"), "y": ("same.txt", b"second")}
        alike = await http.post("/api/predict", data={"body": json.dumps(pair)}, files=two)
    assert by_part.status_code == 200, by_part.text
    assert by_part.json()["result"] == [{"name": "notes.txt", "text": "by multipart"}]
    assert by_b64.status_code == 200, by_b64.text
    assert by_b64.json()["result"] == [{"name": "notes.txt", "text": "by base64"}]
    assert alike.status_code == 200, alike.text
    assert alike.json()["result"] == [
        {"name": "same.txt", "text": "first"}, {"name": "same.txt", "text": "second"},
    ]  # fmt: skip
