"""Fixtures of the chaos tests: the private Redis (see ``_infra``) and pool processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.admission.conftest import open_store, shared_url  # noqa: F401  (fixtures)
from tests.chaos._infra import private_redis  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[2]
LEASE_TTL_S = 3.0


def pool_env(spaces: str, **overrides: str) -> dict[str, str]:
    """Environment of a pool process: ``spaces``, cap 1, lease TTL 3 s unless overridden."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POOL_")}
    env.update(
        PYTHONPATH=str(ROOT),
        NO_PROXY="*",
        POOL_SPACES=spaces,
        POOL_GLOBAL_MAX_CONCURRENT="1",
        POOL_LEASE_TTL_S=str(LEASE_TTL_S),
        POOL_QUEUE_TIMEOUT_S="20",
        POOL_MIN_CONNECTIONS="1",
    )
    env.update(overrides)
    return env


class Procs:
    """Child processes started by a test; killed (and thawed first) at its end."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def spawn(self, module: str, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.started.append(proc)
        return proc


@pytest.fixture
def procs() -> Iterator[Procs]:
    """Start child processes; none outlives the test."""
    running = Procs()
    yield running
    for proc in running.started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a frozen child cannot die cleanly
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


async def read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The next stdout line of ``proc`` (bounded)."""
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout_s)
    return line.strip()


async def read_json(proc: subprocess.Popen[str], timeout_s: float) -> Any:
    return json.loads(await read_line(proc, timeout_s))
