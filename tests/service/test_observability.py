"""What an operator sees: pool-stats behind the admin token with every SPEC 5 key,
Prometheus /metrics that parse and move under load, and logs, metrics and stats that
never carry an email, a token or a payload."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devspaces import SpaceFleet
from tests.conftest import SPEC5_KEYS, SPEC5_POOL_KEYS

from .conftest import ADMIN_TOKEN, ServiceFactory, ServiceProcess, admin_headers

API_TOKEN = "api-token-DISTINCT-4d1f0c"
EMAIL = "Carol.Distinctive@Example.org"
PAYLOAD = "PAYLOAD-7f3c9e-distinctive"
WRONG_TOKEN = "wrong-token-DISTINCT-a8e2"



@pytest.fixture(scope="module")
def service(start_service: ServiceFactory) -> ServiceProcess:
    """An API token and an admin token; a user-hash key so hashes are stable."""
    return start_service(POOL_API_TOKEN=API_TOKEN, POOL_GLOBAL_MAX_CONCURRENT="4")


def auth(token: str = API_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition, keyed by name and labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def total(parsed: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    return sum(value for (sample, _), value in parsed.items() if sample == name)


async def test_pool_stats_needs_the_admin_token_and_has_every_spec_key(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """pool-stats: 401 without or with a wrong token; 200 with it, every SPEC 5 key."""
    async with service.client() as client:
        await client.post("/api/predict", headers=auth(), json={"api_name": "/echo", "args": ["s"]})
        missing = await client.get("/api/admin/pool-stats")
        wrong = await client.get("/api/admin/pool-stats", headers=auth(WRONG_TOKEN))
        basic = await client.get(
            "/api/admin/pool-stats", headers={"Authorization": f"Basic {ADMIN_TOKEN}"}
        )
        api_token = await client.get("/api/admin/pool-stats", headers=auth())
        ok = await client.get("/api/admin/pool-stats", headers=admin_headers())
    for refused in (missing, wrong, basic, api_token):
        assert refused.status_code == 401, refused.text
        assert ADMIN_TOKEN not in refused.text
    assert ok.status_code == 200
    stats: dict[str, Any] = ok.json()
    assert set(stats) >= SPEC5_KEYS, SPEC5_KEYS - set(stats)
    assert set(stats["pools"]) == {"alpha", "beta"}
    for entry in stats["pools"].values():
        assert set(entry) >= SPEC5_POOL_KEYS, SPEC5_POOL_KEYS - set(entry)
    assert stats["initialized"] is True
    assert stats["totalConnections"] >= 1


async def test_metrics_parse_and_the_wait_and_duration_histograms_move_under_load(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """/metrics parses; admission-wait and predict-duration counts grow by the load sent."""
    async with service.client() as client:
        before = samples((await client.get("/metrics")).text)
        responses = await asyncio.gather(
            *(
                client.post(
                    "/api/predict",
                    headers=auth(),
                    json={"api_name": "/echo", "args": [f"m{i}", 0.2], "email": f"m{i}@x.org"},
                )
                for i in range(12)
            )
        )
        assert all(r.status_code == 200 for r in responses)
        response = await client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    after = samples(response.text)
    for histogram in ("spacepool_admission_wait_seconds", "spacepool_predict_duration_seconds"):
        grown = total(after, f"{histogram}_count") - total(before, f"{histogram}_count")
        assert grown >= 12, (histogram, grown)
    ok_outcomes = sum(
        v for (n, labels), v in after.items()
        if n == "spacepool_requests_total" and ("outcome", "ok") in labels
    )  # fmt: skip
    assert ok_outcomes >= 12
    assert total(after, "spacepool_connections") >= 1
    assert ("spacepool_global_limit", ()) in after and after[("spacepool_global_limit", ())] == 4
    assert total(after, "spacepool_user_assignments_total") >= 1
    assert any(n == "spacepool_http_requests_total" for n, _ in after)
    labels = {k for _, ls in after for k, _ in ls}
    assert labels <= {"space", "outcome", "reason", "result", "kind", "stage", "state",
                      "direction", "method", "route", "status", "le", "class",
                      "key"}, labels  # fmt: skip  (class: interactive | batch; key: a key's name)
    keys = {v for (n, ls), _ in after.items() for k, v in ls if k == "key"}
    assert keys <= {"POOL_API_TOKEN", "no key"}, keys  # no API key made here: the two kinds


async def test_logs_metrics_and_stats_never_carry_emails_tokens_or_payloads(
    service: ServiceProcess, spaces: SpaceFleet
) -> None:
    """A run with an email, tokens and a distinctive payload: none of them in logs/metrics/stats."""
    async with service.client() as client:
        ok = await client.post(
            "/api/predict",
            headers={**auth(), "X-Request-ID": "privacy-check-1"},
            json={"email": EMAIL, "api_name": "/echo", "args": [PAYLOAD, 0]},
        )
        assert ok.status_code == 200 and ok.json()["result"].endswith(PAYLOAD)
        job = await client.post(
            "/api/jobs",
            headers=auth(),
            json={"email": EMAIL, "api_name": "/echo", "args": [PAYLOAD, 0]},
        )
        assert job.status_code == 202
        bad = await client.post(
            "/api/predict",
            headers=auth(),
            json={"email": EMAIL, "api_name": "/nope", "args": [PAYLOAD]},
        )
        assert bad.status_code == 422
        invalid = await client.post(
            "/api/predict", headers=auth(), json={"email": EMAIL, "api_name": PAYLOAD + " x"}
        )
        assert invalid.status_code == 422
        refused = await client.post(
            "/api/predict",
            headers=auth(WRONG_TOKEN),
            json={"email": EMAIL, "api_name": "/echo", "args": [PAYLOAD]},
        )
        assert refused.status_code == 401
        job_id = job.json()["job_id"]
        for _ in range(200):
            if (await client.get(f"/api/jobs/{job_id}", headers=auth())).json()["stage"] == "done":
                break
            await asyncio.sleep(0.05)
        metrics = (await client.get("/metrics")).text
        stats = (await client.get("/api/admin/pool-stats", headers=admin_headers())).text

    log = service.log_text()
    secrets = [EMAIL, EMAIL.lower(), API_TOKEN, WRONG_TOKEN, ADMIN_TOKEN, PAYLOAD]
    for where, text in (("log", log), ("metrics", metrics), ("pool-stats", stats)):
        for secret in secrets:
            assert secret not in text, f"{secret!r} found in {where}"
    lines = [line for line in service.log_lines() if line.get("request_id") == "privacy-check-1"]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line["path"] == "/api/predict" and line["status"] == 200 and line["outcome"] == "ok"
    assert line["space"] in ("alpha", "beta") and line["queued_ms"] >= 0
    assert re.fullmatch(r"[0-9a-f]{16}", line["user"]), line
    assert {"ts", "level", "method", "duration_ms"} <= set(line)
    job_lines = [x for x in service.log_lines() if x.get("path") == "/api/jobs/{job_id}"]
    assert job_lines and all(job_id not in str(x) for x in job_lines)


async def test_a_secret_in_the_payload_is_422_refused_with_a_reason_and_never_echoed(
    start_service: ServiceFactory, spaces: SpaceFleet
) -> None:
    """Secret guard on: a payload with a password is 422 {refused, reason}, quoted nowhere."""
    secret = "password=hunter2-DISTINCT-77"
    guarded = start_service(POOL_SECRET_GUARD="on")
    async with guarded.client() as client:
        response = await client.post(
            "/api/predict", json={"api_name": "/echo", "args": [f"my {secret}", 0]}
        )
        job = await client.post("/api/jobs", json={"api_name": "/echo", "args": [secret, 0]})
        job_id = job.json()["job_id"]
        for _ in range(200):
            final = (await client.get(f"/api/jobs/{job_id}")).json()
            if final["stage"] != "queued" and final["stage"] != "running":
                break
            await asyncio.sleep(0.05)
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "refused" and body["reason"] == "secret_assignment"
    assert final["stage"] == "failed" and final["error"]["reason"] == "secret_assignment"
    for text in (response.text, str(final), guarded.log_text()):
        assert "hunter2" not in text
    assert all(s.stats().total == 0 for s in spaces)  # nothing was sent
