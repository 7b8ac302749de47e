"""Stand-in "Spaces": real Gradio apps on 127.0.0.1 for tests, benchmarks and the demo.

The pool talks to Hugging Face Gradio Spaces through gradio_client. None of the Hub is
reachable from CI, so these stand-ins play the Spaces: each is a genuine Gradio 6 app
(queue, sessions, ``gr.State``, ``gr.Error``, the same routes gradio_client uses),
served by uvicorn in a child process on a free loopback port.

Each stand-in of the default kind ("echo") offers three API endpoints, ``/echo`` (text,
delay_s), ``/state`` (value) and ``/fail`` (text); ``kind="image"`` is a file-based Space
(``/flip`` image in/out, ``/report`` a generated file, ``/checksum`` a file in, ``/tone``
WAV audio, and ``/echo``; :mod:`devspaces._media`). Every one measures itself (calls in
flight, peak concurrency, total calls, ``GET /config`` requests, i.e. Clients
constructed) at ``GET /_stand_in/stats``, and can be told at run time to answer slowly,
refuse queue joins with 503, hang, or raise (``POST /_stand_in/control``).
``SpaceProcess.kill``/``restart`` play a crashed or restarted Space (a restart brings a
new ``app_id``).

    with SpaceFleet(3) as fleet:           # alpha, beta, gamma
        os.environ["POOL_SPACES"] = fleet.pool_spaces_env()
        ...
        assert fleet["alpha"].stats().peak <= 4

From a shell: ``python -m devspaces fleet --count 2`` prints the POOL_SPACES value and
serves until Ctrl-C. This package is for tests and demos only: it is not distributed,
and gradio is imported only by the child processes (``build_space`` imports it lazily).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from devspaces._launch import (
    LOGIN_USERS,
    SpaceFleet,
    SpaceProcess,
    SpaceStartError,
    SpaceStats,
    free_port,
)

if TYPE_CHECKING:
    from devspaces._app import build_space

__all__ = [
    "LOGIN_USERS",
    "SpaceFleet",
    "SpaceProcess",
    "SpaceStartError",
    "SpaceStats",
    "build_space",
    "free_port",
]


def __getattr__(name: str) -> Any:
    # gradio takes seconds to import; only a process that serves a Space needs it.
    if name == "build_space":
        from devspaces._app import build_space

        return build_space
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
