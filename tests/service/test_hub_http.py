"""The HTTP face of Hub behaviours: X-IP-Token forwarding, quota 429, a private Space."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.requests import Request

from app.calls._inputs import identity_headers
from app.core._settings import ServiceSettings
from devspaces import SpaceFleet, SpaceProcess
from tests.service.conftest import ServiceProcess, admin_headers, service_env

SECRET = "hf_private_token_for_http_tests_41b7e2"
IP_TOKEN = "ip-token-of-user-a-93f0"


@pytest.fixture(scope="module")
def hub_service(
    zero: SpaceProcess, fleet: SpaceFleet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """The service over "zero" and the fleet's beta (made private), forwarding X-IP-Token."""
    beta = fleet["beta"]
    beta.control(require_token=SECRET)
    directory = tmp_path_factory.mktemp("hub")
    env = service_env(
        f"zero={zero.url},beta={beta.url}", directory,
        POOL_FORWARD_IP_TOKEN="true", POOL_HF_TOKEN=SECRET, POOL_MIN_CONNECTIONS="1",
    )  # fmt: skip
    service = ServiceProcess(env, directory / "service.log")
    try:
        yield service
    finally:
        service.stop()
        beta.control(require_token="")


def _request(*headers: tuple[bytes, bytes]) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": list(headers)})


def test_ip_token_is_forwarded_only_when_enabled() -> None:
    """X-IP-Token becomes the call's x-ip-token only with POOL_FORWARD_IP_TOKEN=true."""
    request = _request((b"x-ip-token", b"t0k"), (b"authorization", b"Bearer api"))
    assert identity_headers(request, ServiceSettings(forward_ip_token=True)) == {
        "x-ip-token": "t0k"
    }
    assert identity_headers(request, ServiceSettings()) == {}
    assert identity_headers(_request(), ServiceSettings(forward_ip_token=True)) == {}


async def test_quota_429_and_secrets_never_shown(
    hub_service: ServiceProcess, zero: SpaceProcess
) -> None:
    """The caller's X-IP-Token reaches the ZeroGPU Space on its call only; out of quota is
    429 quota_exceeded with Retry-After; a private Space is served with POOL_HF_TOKEN; no
    token appears in the log, metrics, pool-stats or any answer."""
    answers: list[str] = []
    async with hub_service.client() as http:
        body = {"space": "zero", "api_name": "/gpu", "args": ["a", 4]}
        mine = await http.post("/api/predict", json=body, headers={"X-IP-Token": IP_TOKEN})
        assert mine.status_code == 200 and mine.json()["result"] == f"{IP_TOKEN}:a"
        other = await http.post("/api/predict", json={**body, "args": ["b", 4]})
        assert other.json()["result"] == "anonymous:b"  # not carried over to another call
        over = await http.post(
            "/api/predict", json={**body, "args": ["c", 9]}, headers={"X-IP-Token": IP_TOKEN}
        )
        assert over.status_code == 429, over.text
        assert over.headers["Retry-After"] == "65"
        assert over.json()["error"] == "quota_exceeded" and over.json()["retry_after_s"] == 65
        private = await http.post(
            "/api/predict", json={"space": "beta", "api_name": "/echo", "args": ["p", 0]}
        )
        assert private.status_code == 200 and private.json()["result"] == "beta:p"
        stats = await http.get("/api/admin/pool-stats", headers=admin_headers())
        metrics = await http.get("/metrics")
        assert 'outcome="quota_exceeded"' in metrics.text
        answers += [mine.text, other.text, over.text, private.text, stats.text, metrics.text]
    answers.append(hub_service.log_text())
    assert not [text[:200] for text in answers if SECRET in text]
    # The IP token is echoed back by the stand-in in the result only (the first answer).
    assert not [text for text in answers[1:] if IP_TOKEN in text]
