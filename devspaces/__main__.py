"""``python -m devspaces serve ...`` runs one stand-in Space; ``fleet`` runs several.

python -m devspaces serve --name alpha --port 7861 [--config-delay S]
                          [--max-size M] [--concurrency C] [--kind K] [--login]
python -m devspaces fleet --count 2     # prints POOL_SPACES, serves until Ctrl-C
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from devspaces._launch import HOST, SpaceFleet, child_env


def _serve(args: argparse.Namespace) -> int:
    # Same environment a SpaceProcess child gets, for a Space started by hand.
    for key, value in child_env().items():
        os.environ.setdefault(key, value)
    import uvicorn

    from devspaces._app import build_space

    app = build_space(
        args.name,
        config_delay_s=args.config_delay,
        concurrency_limit=args.concurrency,
        max_size=args.max_size,
        kind=args.kind,
        login=args.login,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=1,
    )
    return 0


def _fleet(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    with SpaceFleet(
        args.count,
        config_delay_s=args.config_delay,
        concurrency_limit=args.concurrency,
        max_size=args.max_size,
        kind=args.kind,
    ) as fleet:
        print(fleet.pool_spaces_env(), flush=True)
        while not stop.wait(0.5):
            dead = [space.name for space in fleet if not space.is_running()]
            if dead:
                print(f"stand-in Space(s) exited: {', '.join(dead)}", file=sys.stderr)
                return 1
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devspaces", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--config-delay", type=float, default=0.0, metavar="S")
        sub.add_argument("--concurrency", type=int, default=64, metavar="C")
        sub.add_argument("--max-size", type=int, default=None, metavar="M")
        sub.add_argument(
            "--kind",
            default="echo",
            help="stand-in app: echo (text), image (files), stream (generator), chat, shapes",
        )

    serve = commands.add_parser("serve", help="run one stand-in Space")
    serve.add_argument("--name", required=True)
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--host", default=HOST, help="address to bind (default %(default)s)")
    serve.add_argument("--log-level", default="warning")
    serve.add_argument(
        "--login", action="store_true", help="behind Gradio's login (devspaces.LOGIN_USERS)"
    )
    common(serve)
    serve.set_defaults(run=_serve)

    fleet = commands.add_parser("fleet", help="run several; print POOL_SPACES")
    fleet.add_argument("--count", type=int, default=2)
    common(fleet)
    fleet.set_defaults(run=_fleet)

    zygote = commands.add_parser(
        "zygote", help="fork Spaces on request over the socket on stdin (devspaces._zygote)"
    )
    zygote.set_defaults(run=_zygote)
    return parser


def _zygote(args: argparse.Namespace) -> int:
    from devspaces._zygote import main as zygote_main

    return zygote_main()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
