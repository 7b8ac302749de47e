"""Pre-forked services for the tests: ``uvicorn app.main:app`` forked from a zygote that
has imported uvicorn, FastAPI, pydantic, httpx, gradio_client, redis... once.

A service start was ~1.2 s of CPU, ~0.6 s of it importing those libraries, and the suite
starts about a hundred services (``tests/service/conftest.py``'s ``ServiceProcess``) on
2 cores. The zygote is ``devspaces/_zygote.py``'s, the one the stand-in Spaces are
forked from (same protocol, same no-orphans rules); here each child runs uvicorn's own
command line, and imports ``app`` and ``pool`` itself after its environment is set, as a
fresh process would: only third-party libraries are shared.

What stays as it was: each service is its own process (own pid, port, log file; stopped,
killed and frozen with real signals), started with the environment the test gave it.
A library may read the environment when it is imported (huggingface_hub does), so a
zygote serves only services whose environment, but for the ``POOL_*`` settings (read by
the service at start-up, never at import) and ``PYTEST_CURRENT_TEST``, is the one it was
started with; another environment gets a zygote of its own (a test process rarely sees
more than two). Not
forked: ``--workers`` above 1 (uvicorn spawns those itself), and every service when
``SPACEPOOL_TEST_PREFORK=0``.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO

from devspaces._launch import _popen
from devspaces._zygote import ForkedSpace, Zygote, serve_forever

ROOT = Path(__file__).resolve().parents[1]
# What every service imports that is not the project's own code (measured with
# ``python -X importtime -c "import app.main"``); a name missing here only costs time.
PRELOAD = (
    "uvicorn.main", "uvicorn.config", "uvicorn.server", "uvicorn.lifespan.on",
    "uvicorn.loops.auto", "uvicorn.protocols.http.auto", "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.http.httptools_impl", "uvicorn.protocols.websockets.auto",
    "fastapi", "fastapi.routing", "fastapi.openapi.models", "fastapi.responses",
    "fastapi.security", "starlette.middleware.base", "starlette.staticfiles", "pydantic",
    "pydantic.networks", "pydantic.functional_validators", "pydantic.json_schema",
    "pydantic_settings", "httpx", "httpx_sse", "anyio", "gradio_client",
    "gradio_client.utils", "huggingface_hub", "redis", "redis.asyncio", "prometheus_client",
    "opentelemetry.trace", "python_multipart", "multipart", "orjson", "yaml", "rich",
    "cachetools", "sqlite3", "difflib", "email.mime.multipart",
)  # fmt: skip
ON = os.environ.get("SPACEPOOL_TEST_PREFORK", "1") != "0"
_MAX_ZYGOTES = 4  # per test process; past that a service is a process of its own


# The zygote ----------------------------------------------------------------------------


def _uvicorn(argv: list[str]) -> int:
    """A child: ``python -m uvicorn <argv>``."""
    command = importlib.import_module("uvicorn.main").main  # the click command
    sys.argv = ["uvicorn", *argv]
    command.main(args=argv, prog_name="uvicorn")  # exits (SystemExit), as `python -m uvicorn`
    return 0


def main() -> int:
    """``python -m tests._prefork``: the control socket is fd 0."""
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    return serve_forever(socket.socket(fileno=0), run=_uvicorn)


# The test process's side ------------------------------------------------------------------


# Read at run time only: POOL_* (the service's settings) and pytest's note of the test
# running (it changes with every test; a service gets its own value all the same).
def _key(env: dict[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset(
        (k, v) for k, v in env.items() if not k.startswith("POOL_") and k != "PYTEST_CURRENT_TEST"
    )


_zygotes: dict[frozenset[tuple[str, str]], Zygote] = {}
_lock = threading.Lock()


def spawn_uvicorn(argv: list[str], env: dict[str, str], log: IO[bytes]) -> ForkedSpace | None:
    """``python -m uvicorn <argv>`` in ``env``, forked by the zygote for ``env`` (started
    on first use); None when this one is not to be forked (then start it yourself)."""
    if not ON:
        return None
    key = _key(env)
    with _lock:
        zygote = _zygotes.get(key)
        if zygote is None or not zygote.alive():
            if zygote is None and len(_zygotes) >= _MAX_ZYGOTES:
                return None
            zygote_env = dict(key)
            output = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the zygote
            command = [sys.executable, "-m", "tests._prefork"]
            zygote = Zygote(lambda sock: _popen(command, sock, output, zygote_env), output)
            _zygotes[key] = zygote
    return zygote.spawn(argv, env, log)


@atexit.register
def _end() -> None:
    """At exit each zygote ends its services and is waited for (no zombie, CPU counted)."""
    for zygote in _zygotes.values():
        zygote.close(wait_s=10.0)


if __name__ == "__main__":
    sys.exit(main())
