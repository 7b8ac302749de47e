"""Fixtures for the HTTP service: real uvicorn processes over real stand-in Spaces.

``start_service(**env)`` runs ``python -m uvicorn app.main:app`` in a child process
with ``POOL_SPACES`` pointing at the session's stand-in fleet (``fleet`` from
``tests/conftest.py``) and a coordinator of its own (an SQLite file in the test's temp
dir when the SQLite store exists, so no other run on this machine shares its leases).
Its stderr (the JSON log) is kept in a file for the tests that read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app._http import PROTOCOL as HTTP_PROTOCOL
from devspaces import SpaceFleet, free_port
from devspaces._zygote import ForkedSpace
from tests._prefork import spawn_uvicorn

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "admin-token-for-tests-5b1e"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: long acceptance run (SPACEPOOL_SLOW_TESTS=1)")


def coordinator_url(directory: Path) -> str:
    """The shipped default store (SQLite) in ``directory``, or memory:// if it is missing."""
    if importlib.util.find_spec("pool.admission._sqlite") is None:
        return "memory://"
    return f"sqlite:///{directory / 'coordinator.db'}"


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll ``check`` every 20 ms until it holds; return the seconds it took."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            pytest.fail(f"{what}: not within {timeout_s} s")
        time.sleep(0.02)
    return time.monotonic() - started


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout_s: float, what: str, *, every_s: float = 0.02
) -> float:
    """Await ``check`` until it holds (bounded polling); return the seconds it took."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout_s:
            pytest.fail(f"{what}: not within {timeout_s} s")
        await asyncio.sleep(every_s)
    return time.monotonic() - started


@functools.cache
def tls() -> ssl.SSLContext:
    """One TLS context per test process, as httpx would make it (SSL_CERT_FILE /
    SSL_CERT_DIR, else certifi), for the tests' httpx clients: a client made without
    one loads the CA bundle again, ~25-30 ms of CPU each (a service start polled
    /healthz every 50 ms with a new client: most of a core while it waited)."""
    cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    if cafile or capath:
        return ssl.create_default_context(cafile=cafile, capath=capath)
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


class ServiceProcess:
    """``uvicorn app.main:app`` in a child process on a free loopback port."""

    def __init__(self, env: dict[str, str], log_path: Path, *, workers: int = 1) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("wb")
        argv = ["app.main:app", "--host", "127.0.0.1"]
        argv += ["--http", HTTP_PROTOCOL]  # as every way the project starts it
        argv += ["--port", str(self.port), "--log-level", "warning", "--workers", str(workers)]
        # One worker: forked by a zygote that imported the libraries (tests/_prefork.py).
        forked = spawn_uvicorn(argv, env, self._log) if workers == 1 else None
        self.proc: subprocess.Popen[bytes] | ForkedSpace = forked or subprocess.Popen(
            [sys.executable, "-m", "uvicorn", *argv],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 90  # imports are slow on a busy 2-core machine
        with httpx.Client(timeout=1, verify=tls()) as http:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"service exited at start:\n{self.log_text()[-3000:]}")
                with contextlib.suppress(httpx.TransportError):
                    if (
                        http.get(f"{self.url}/healthz").status_code == 200
                        and len(self.ready_pids()) >= workers
                    ):
                        break
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"service did not answer:\n{self.log_text()[-3000:]}")
                time.sleep(0.05)

    def ready_pids(self) -> set[int]:
        """Workers that finished start-up (their lifespan logged "serving ...")."""
        return {
            line["pid"] for line in self.log_lines() if str(line.get("msg")).startswith("serving ")
        }

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self) -> list[dict[str, Any]]:
        """The JSON lines of the log (uvicorn's own plain lines are skipped)."""
        lines = []
        for line in self.log_text().splitlines():
            with contextlib.suppress(ValueError):
                parsed = json.loads(line)
                if isinstance(parsed, dict):
                    lines.append(parsed)
        return lines

    def client(self, **headers: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=60, headers=headers, verify=tls())

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()
        return self.proc.returncode


ServiceFactory = Callable[..., ServiceProcess]


def service_env(fleet: SpaceFleet | str, directory: Path, **overrides: str) -> dict[str, str]:
    """The service's environment over ``fleet`` (or a POOL_SPACES value)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POOL_") and k != "HF_TOKEN"}
    env.update(
        POOL_SPACES=fleet if isinstance(fleet, str) else fleet.pool_spaces_env(),
        POOL_COORDINATOR_URL=coordinator_url(directory),
        POOL_MIN_CONNECTIONS="2",
        POOL_ADMIN_TOKEN=ADMIN_TOKEN,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(ROOT),
        NO_PROXY="*",
    )
    env.update(overrides)
    return env


@pytest.fixture(scope="module")
def start_service(
    fleet: SpaceFleet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceFactory]:
    """Start services over the fleet (``start_service(POOL_X="...")``); stopped at the end."""
    started: list[ServiceProcess] = []

    def start(workers: int = 1, **env: str) -> ServiceProcess:
        directory = tmp_path_factory.mktemp("service")
        service = ServiceProcess(
            service_env(fleet, directory, **env), directory / "service.log", workers=workers
        )
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()


@pytest.fixture
def spaces(fleet: SpaceFleet) -> SpaceFleet:
    """The shared stand-in fleet, behaving normally, its counters zeroed."""
    for space in fleet:
        space.control(mode="ok", config_delay_s=0.0)
    wait_for(lambda: all(s.stats().in_flight == 0 for s in fleet), 10, "Spaces idle")
    fleet.reset()
    return fleet


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}
