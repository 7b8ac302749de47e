"""``python -m app``: run the service on this machine, with demo Spaces if none are set.

    python -m app [--host 127.0.0.1] [--port 7860]      (PORT in the environment also works)

* ``POOL_SPACES`` unset: three local stand-in Spaces of three kinds (real Gradio apps,
  :data:`DEMO_SPACES`; needs the ``demo`` extra and the checkout as the working
  directory) are started first and ``POOL_SPACES`` points at them: ``alpha`` echoes
  text, ``chat`` streams a chat reply token by token (``gr.ChatInterface``), ``pic``
  exchanges files (``/flip`` an image, ``/report`` a text file). ``alpha`` and ``pic``
  have ``/echo(text, delay_s)`` (slow with a delay: the queue's demo); a call without
  ``"space"`` goes to the Spaces that have its endpoint (README: the demo's endpoints).
* With the demo Spaces, ``POOL_GRADIO_PAGES`` defaults to them: each one's own Gradio
  page is served at ``/gradio/{alias}/`` (the banner prints the URLs).
* ``POOL_ADMIN_TOKEN`` unset: a random one is generated and printed once, here — the
  operator's own terminal is the one place a token may be shown.
* ``POOL_COORDINATOR_URL`` unset: ``memory://`` (this command runs one process).
* The settings are checked first (app/core/_startup.py): a malformed one is a line on stderr
  and exit 2, a Redis store that does not answer a line and exit 1, before the banner.

Prints the URL and ready-to-paste curl commands, serves until Ctrl-C, then stops the
demo Spaces.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import sys
from collections.abc import Iterator, Sequence
from types import FrameType

import uvicorn

from app._http import PROTOCOL as HTTP_PROTOCOL
from app.core import startup as _startup

DEMO_SPACES = {"alpha": "echo", "chat": "chat", "pic": "image"}  # name -> stand-in kind


@contextlib.contextmanager
def _demo_spaces() -> Iterator[None]:
    """Start the demo Spaces when POOL_SPACES is not set; stop them on the way out."""
    if os.environ.get("POOL_SPACES", "").strip():
        yield
        return
    sys.path.insert(0, os.getcwd())
    try:
        from devspaces import SpaceFleet  # imported lazily: test-only, needs gradio
    except ImportError as exc:
        raise SystemExit(
            "POOL_SPACES is not set and the demo Spaces cannot start "
            f"({exc}); run from the checkout with the demo extra installed (scripts/run does it), "
            "or set POOL_SPACES"
        ) from exc
    shown = ", ".join(f"{name} ({kind})" for name, kind in DEMO_SPACES.items())
    print(f"POOL_SPACES is not set: starting local demo Spaces: {shown}...", flush=True)
    # Generous start-up limit: importing gradio takes a while on a busy machine.
    with SpaceFleet(
        names=list(DEMO_SPACES), kind=list(DEMO_SPACES.values()), startup_timeout_s=180
    ) as fleet:
        os.environ["POOL_SPACES"] = fleet.pool_spaces_env()
        # The demo's own Spaces: their pages are served (docs/security.md says when not to).
        os.environ.setdefault("POOL_GRADIO_PAGES", ",".join(DEMO_SPACES))
        print(f"  POOL_SPACES={os.environ['POOL_SPACES']}", flush=True)
        try:
            yield
        finally:
            print("stopping the demo Spaces...", flush=True)
    os.environ.pop("POOL_SPACES", None)


def _admin_token() -> str | None:
    """The admin token to show once, if we had to make one."""
    if os.environ.get("POOL_ADMIN_TOKEN", "").strip():
        return None
    token = secrets.token_urlsafe(24)
    os.environ["POOL_ADMIN_TOKEN"] = token
    return token


def _demo_pages() -> list[str]:
    """The demo Spaces whose pages are served (``POOL_GRADIO_PAGES``, which the demo
    sets to them unless the caller set it)."""
    words = {w.strip() for w in os.environ.get("POOL_GRADIO_PAGES", ",".join(DEMO_SPACES))
             .split(",") if w.strip()}  # fmt: skip
    if {w.lower() for w in words} & {"true", "1", "yes", "on"}:
        return list(DEMO_SPACES)
    return [name for name in DEMO_SPACES if name in words]


def _banner(url: str, generated_token: str | None, *, demo: bool) -> str:
    api_auth = (
        ' -H "Authorization: Bearer $POOL_API_TOKEN"'
        if os.environ.get("POOL_API_TOKEN", "").strip()
        else ""
    )
    lines = [
        "",
        f"spacepool is starting on {url}   (Ctrl-C to stop)",
        f"  API docs:   {url}/docs",
    ]
    if generated_token is not None:
        lines += [
            "  POOL_ADMIN_TOKEN was not set; generated for this run (shown only here):",
            f"    export POOL_ADMIN_TOKEN={generated_token}",
        ]
    lines += [
        "",
        "Try:",
        f"  curl -s -X POST {url}/api/predict{api_auth} \\",
        "       -H 'Content-Type: application/json' \\",
        """       -d '{"email": "you@example.com", "api_name": "/echo", "args": ["hello", 0]}'""",
        f'  curl -s {url}/api/admin/pool-stats -H "Authorization: Bearer $POOL_ADMIN_TOKEN"',
        f"  curl -s {url}/metrics",
        "",
    ]
    if demo:
        lines += [
            "A chat reply streamed as Server-Sent Events (the chat demo Space):",
            f"  curl -sN -X POST {url}/api/predict{api_auth} \\",
            "       -H 'Content-Type: application/json' \\",
            """       -d '{"api_name": "/chat", "args": ["tell me a story"], "stream": true}'""",
            "A file made by a Space (pic), fetched from the URL its answer names:",
            f"  curl -s {url}$(curl -s -X POST {url}/api/predict{api_auth} \\",
            "       -H 'Content-Type: application/json' \\",
            """       -d '{"api_name": "/report", "args": ["hello", 3]}' \\""",
            "       | python3 -c 'import json,sys;"
            """ print(json.load(sys.stdin)["result"]["file"]["url"])')"""
            f"{api_auth}",
            f"Dashboard: {url}/admin    Endpoints of a Space: {url}/api/spaces/pic/api",
            "",
        ]
        pages = _demo_pages()
        if pages:
            lines += ["Each demo Space's own page through the pool (open one in a browser):"]
            lines += [f"  {name}: {url}/gradio/{name}/" for name in pages] + [""]
    return "\n".join(lines)


def _check_settings() -> int:
    """The settings checked before the banner (app/core/_startup.py): each problem and warning
    on one line of stderr; 2 for a malformed setting, 1 for a store that does not answer,
    else 0."""
    problems, warnings = _startup.check_environment(os.environ)
    for line in warnings:
        print(f"spacepool: warning: {line}", file=sys.stderr, flush=True)
    for line in problems:
        print(f"spacepool: error: {line}", file=sys.stderr, flush=True)
    _startup.CHECKED = True  # the lifespan, in this process, does not repeat them
    if problems:
        return 2
    down = asyncio.run(_startup.coordinator_problem(os.environ["POOL_COORDINATOR_URL"]))
    if down is not None:
        print(f"spacepool: error: {down}", file=sys.stderr, flush=True)
        return 1
    return 0


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "7860")))
    args = parser.parse_args(argv)
    os.environ.setdefault("POOL_COORDINATOR_URL", "memory://")
    failed = _check_settings()
    if failed:
        return failed
    generated = _admin_token()
    url = f"http://{args.host}:{args.port}"
    demo = not os.environ.get("POOL_SPACES", "").strip()
    with _demo_spaces():
        print(_banner(url, generated, demo=demo), flush=True)
        config = uvicorn.Config(
            "app.main:app",
            host=args.host,
            port=args.port,
            log_level="info",
            access_log=False,
            http=HTTP_PROTOCOL,  # request heads bounded (app/_http.py)
            # An open SSE stream would otherwise hold the shutdown until its job ends.
            timeout_graceful_shutdown=5,
        )
        server = uvicorn.Server(config)
        # uvicorn re-raises the signal that stopped it once it is done: turn SIGTERM,
        # like Ctrl-C, into an exception here so that the demo Spaces are stopped.
        signal.signal(signal.SIGTERM, _stop)
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
        if not server.started:
            print("the server did not start (see the log above)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
