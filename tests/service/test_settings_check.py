"""Settings checked at start (app/core/_startup.py): a mistake is one clear line before the
banner, a likely mistake a warning, an unreachable store or Space named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.core._startup import check_environment, hide_password
from devspaces import free_port

from .conftest import ServiceProcess, service_env

ROOT = Path(__file__).resolve().parents[2]


def test_malformed_values_are_one_line_each_naming_the_setting_and_the_valid_forms() -> None:
    """A Space entry of no known form, a store URL without its scheme's "://", a number
    that is not one: one line each, naming the setting, what is wrong, the valid forms."""
    problems, _ = check_environment({
        "POOL_SPACES": "htp://127.0.0.1:7861",
        "POOL_COORDINATOR_URL": "rediss//127.0.0.1",
        "POOL_MAX_BODY_BYTES": "lots",
    })  # fmt: skip
    assert len(problems) == 3, problems
    by_name = {p.split("=")[0].split(":")[0]: p for p in problems}
    assert "'htp://127.0.0.1:7861'" in by_name["POOL_SPACES"]
    assert "owner/name, http(s)://host:port/, alias=URL" in by_name["POOL_SPACES"]
    assert "redis://host:port/db" in by_name["POOL_COORDINATOR_URL"]
    assert "memory://" in by_name["POOL_COORDINATOR_URL"]
    assert "valid integer" in by_name["POOL_MAX_BODY_BYTES"]
    assert all("\n" not in p for p in problems)


def test_an_unknown_pool_variable_is_warned_with_the_closest_name() -> None:
    """A misspelled POOL_GLOBAL_MAX_CONCURENT or POOL_SPACE is named with the setting
    meant; a setting spelled right is not; nothing of it is a problem."""
    problems, warnings = check_environment({
        "POOL_GLOBAL_MAX_CONCURENT": "3", "POOL_SPACE": "", "POOL_QUEUE_TIMEOUT_S": "5",
    })  # fmt: skip
    assert problems == []
    assert any("POOL_GLOBAL_MAX_CONCURENT" in w and "POOL_GLOBAL_MAX_CONCURRENT?" in w
               for w in warnings), warnings  # fmt: skip
    assert any(w.startswith("POOL_SPACE ") and "POOL_SPACES?" in w for w in warnings)
    assert not any("POOL_QUEUE_TIMEOUT_S" in w for w in warnings)


def test_a_short_admin_token_is_warned_and_secrets_are_never_quoted() -> None:
    """An admin token under 32 characters is a warning that does not quote it; a bad
    POOL_SPACE_AUTH or a store URL with a password never shows the password."""
    problems, warnings = check_environment({
        "POOL_ADMIN_TOKEN": "abc",
        "POOL_SPACES": "a=http://127.0.0.1:1/",
        "POOL_SPACE_AUTH": "a=alice",  # no password separator
        "POOL_COORDINATOR_URL": "redis://:hunter2@127.0.0.1:port/0",
    })  # fmt: skip
    assert any("POOL_ADMIN_TOKEN is shorter than 32" in w for w in warnings)
    assert "abc" not in " ".join(warnings)
    assert any("POOL_SPACE_AUTH entry 1" in p for p in problems), problems
    assert any("POOL_COORDINATOR_URL" in p and ":***@" in p for p in problems), problems
    assert "hunter2" not in " ".join(problems + warnings) and "alice" not in " ".join(problems)
    assert hide_password("redis://u:pw@h:1/0") == "redis://u:***@h:1/0"
    _, fine = check_environment({"POOL_ADMIN_TOKEN": "x" * 32})
    assert fine == []


def _python_m_app(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("POOL_")}
    clean.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "app", "--port", str(free_port())], cwd=ROOT,
                          env=clean, capture_output=True, text=True, timeout=60)  # fmt: skip


def test_python_m_app_exits_before_its_banner_with_one_line() -> None:
    """`python -m app` with a malformed setting: exit 2, one error line naming it, no
    traceback, no banner; with a Redis store that does not answer: exit 1, one line
    naming POOL_COORDINATOR_URL (its password hidden)."""
    bad = _python_m_app(POOL_SPACES="htp://127.0.0.1:1", POOL_COORDINATOR_URL="rediss//h")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    errors = [line for line in bad.stderr.splitlines() if line.startswith("spacepool: error:")]
    assert len(errors) == 2 and "POOL_SPACES" in errors[0] + errors[1], bad.stderr
    assert "Traceback" not in bad.stderr + bad.stdout
    assert "spacepool is starting" not in bad.stdout
    closed = free_port()
    down = _python_m_app(POOL_SPACES="a=http://127.0.0.1:1/",
                         POOL_COORDINATOR_URL=f"redis://:pw@127.0.0.1:{closed}/0")  # fmt: skip
    assert down.returncode == 1, down.stdout + down.stderr
    lines = down.stderr.strip().splitlines()
    assert len(lines) == 1 and "POOL_COORDINATOR_URL" in lines[0] and ":***@" in lines[0], lines
    assert "does not answer" in lines[0] and "Traceback" not in down.stderr


async def test_an_unreachable_space_is_logged_by_name_shown_in_readyz_and_named_in_errors(
    tmp_path: Path,
) -> None:
    """A Space that does not answer at start: one warning naming it (not its URL), 503
    /readyz with it down, and a call's error naming it."""
    ghost = f"http://127.0.0.1:{free_port()}/"
    env = service_env(f"ghost={ghost}", tmp_path, POOL_COORDINATOR_URL="memory://",
                      POOL_RETRY_ATTEMPTS="1", POOL_CONNECT_ATTEMPTS="1")  # fmt: skip
    service = ServiceProcess(env, tmp_path / "service.log")
    try:
        async with service.client() as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["apps"]["ghost"]["spaces"] == {"ghost": "down"}, ready.json()
            answer = await client.post("/api/predict", json={"api_name": "/x", "args": []})
            assert answer.status_code == 503, answer.text
            assert "ghost" in answer.json()["message"], answer.json()
        log = service.log_text()
        warned = [line for line in log.splitlines() if "does not answer at start" in line]
        assert len(warned) == 1 and "Space ghost" in warned[0], log[-2000:]
        assert ghost.rstrip("/") not in warned[0]
    finally:
        service.stop()
