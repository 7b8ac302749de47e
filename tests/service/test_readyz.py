"""``GET /readyz`` (issue 32): 503 while the coordinator does not answer or while every
Space of an app is down, 200 otherwise; ``/healthz`` stays liveness throughout. Real
uvicorn processes, real stand-in Spaces, a private redis-server that the test freezes.
"""

from __future__ import annotations

import uuid

import httpx

from app.core._settings import outbound_port_problem
from devspaces import SpaceFleet, free_port
from tests.chaos._infra import PrivateRedis, private_redis  # noqa: F401  (a fixture)

from .conftest import ServiceFactory, eventually


async def _status(url: str, path: str) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        return (await client.get(path)).status_code


async def test_ready_over_live_spaces_and_not_while_the_coordinator_is_frozen(
    start_service: ServiceFactory, fleet: SpaceFleet, private_redis: PrivateRedis  # noqa: F811
) -> None:
    """Redis answers, every Space up: 200. Redis frozen (SIGSTOP): 503 "unreachable"
    while /healthz stays 200. Thawed: 200 again."""
    service = start_service(POOL_COORDINATOR_URL=private_redis.url)
    async with service.client() as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        body = ready.json()
        assert body["coordinator"] == "ok" and all(a["ready"] for a in body["apps"].values())
        private_redis.freeze()
        try:

            async def not_ready() -> bool:
                return (await client.get("/readyz")).status_code == 503

            await eventually(not_ready, 15, "/readyz 503 with the store frozen", every_s=0.2)
            frozen = await client.get("/readyz")
            assert frozen.json()["coordinator"] == "unreachable"
            assert (await client.get("/healthz")).status_code == 200
        finally:
            private_redis.thaw()

        async def ready_again() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await eventually(ready_again, 15, "/readyz 200 once the store answers", every_s=0.2)


async def test_not_ready_while_every_space_of_one_app_is_down(
    start_service: ServiceFactory, fleet: SpaceFleet
) -> None:
    """The fleet plus an app whose only Space does not answer: 503, that app named not
    ready and its Space down, the others ready; /healthz 200."""
    dead = f"dead@lonely=http://127.0.0.1:{free_port()}/"
    service = start_service(POOL_SPACES=f"{fleet.pool_spaces_env()},{dead}")
    async with service.client() as client:
        answer = await client.get("/readyz")
        assert answer.status_code == 503, answer.text
        apps = answer.json()["apps"]
        assert apps["lonely"] == {"ready": False, "spaces": {"dead": "down"}}
        assert all(a["ready"] for name, a in apps.items() if name != "lonely")
        assert (await client.get("/healthz")).status_code == 200


def test_outbound_port_rule_names_only_ports_a_space_cannot_reach() -> None:
    """6379 (explicit or Redis's default) is flagged; 443, 8080, 80 and local stores are
    not; the message never quotes the URL (it may carry a password)."""
    flagged = outbound_port_problem("redis://:s3cret@redis.example.com/0")
    assert flagged is not None and "6379" in flagged and "s3cret" not in flagged
    assert outbound_port_problem("rediss://:pw@host:6380/0") is not None
    assert outbound_port_problem("rediss+cluster://a:443,b:6379/") is not None
    assert outbound_port_problem("redis+sentinel://a:8080,b/svc/0") is not None  # 26379
    assert outbound_port_problem("rediss+cluster://a:443,b:443/") is None
    for fine in ("rediss://:pw@host:443/0", "redis://host:8080/0", "redis://host:80",
                 "sqlite:////tmp/x.db", "memory://", ""):  # fmt: skip
        assert outbound_port_problem(fine) is None, fine


def test_a_service_on_a_space_warns_at_start_up_of_an_unreachable_store_port(
    start_service: ServiceFactory, fleet: SpaceFleet
) -> None:
    """With SPACE_ID set and the store on 6379, start-up logs the port warning once;
    the service still starts (a store the Space cannot reach is the operator's call)."""
    url = f"redis://127.0.0.1:6379/0?prefix=test-hubport-{uuid.uuid4().hex[:8]}:"
    service = start_service(POOL_COORDINATOR_URL=url, SPACE_ID="owner/spacepool")
    warnings = [line for line in service.log_lines()
                if "ports 80, 443 and 8080" in str(line.get("msg"))]  # fmt: skip
    assert len(warnings) == 1 and warnings[0]["level"] == "warning"
