"""Run stand-in Spaces in child processes, so a test can kill, freeze or restart them.

Each Space is ``python -m devspaces serve ...`` under uvicorn on 127.0.0.1. The parent
never imports gradio: this module needs only httpx, so a test process that merely
points a pool at stand-ins stays light. That command is run by forking a per-process
zygote that imported gradio once (``devspaces/_zygote.py``: ~0.25 s of CPU per Space
instead of ~2.5 s); ``DEVSPACES_ZYGOTE=0``, or a command of its own (a Space in a
network namespace), spawns it as a process of its own as below.

No orphans. A child asks the kernel (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, Linux only,
in a ``preexec_fn``) to be killed when its parent goes, so a test run killed with
SIGKILL takes its Spaces with it. The kernel's "parent" is the *thread* that forked, not
the process: a Space started from a short-lived thread (``asyncio.to_thread`` in a
function-scoped event loop, a worker that finishes) would be killed when that thread
ends. So every child is forked by one module-wide spawner thread that lives as long as
the process, whatever thread calls ``start()``. The ``preexec_fn`` runs one pre-resolved
C call and ``os.getppid()``: nothing that could wait on a lock another thread held at
fork time. (A SIGKILLed child stays a zombie until PID 1 reaps it; its port is free.)

Output of a child goes to an unnamed temporary file, read with ``os.pread`` (which does
not move the offset the child writes at) when a start fails.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import functools
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal, Self

import httpx

from devspaces._zygote import ForkedSpace, Zygote

Mode = Literal["ok", "queue_full", "hang", "raise", "probe_fail"]

HOST = "127.0.0.1"
# The users of a stand-in Space behind Gradio's login (SpaceProcess(login=True)):
# (username, password), the first for the pool (POOL_SPACE_AUTH), the second for a caller.
LOGIN_USERS = (("spacepool", "pool-pass-41c9e7"), ("alice", "alice-pass-8e2d05"))
DEFAULT_NAMES = (
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta",
    "eta", "theta", "iota", "kappa", "lambda", "mu",
)  # fmt: skip
_REPO_ROOT = Path(__file__).resolve().parent.parent
_PR_SET_PDEATHSIG = 1
_STDERR_TAIL = 4000
_POLL_S = 0.05


class SpaceStartError(RuntimeError):
    """A stand-in Space did not answer ``GET /gradio_api/app_id`` in time, or exited."""


@dataclass(frozen=True)
class SpaceStats:
    """What a stand-in Space measured about itself (``GET /_stand_in/stats``)."""

    name: str
    in_flight: int
    peak: int
    total: int
    config_requests: int
    app_id: int
    mode: Mode
    refused: int = 0
    rate_limited: int = 0
    unauthorized: int = 0


_PORT_ATTEMPTS = 3  # a Space on a port of its own choosing tries this many ports


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def child_env() -> dict[str, str]:
    """Environment for a child Space: no telemetry, no Hub, no proxies, repo importable;
    not the service's uvicorn settings (``WEB_CONCURRENCY=2 scripts/run`` made each
    stand-in's uvicorn ask for workers, which it refuses: the demo did not start)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key.lower() not in {"http_proxy", "https_proxy", "all_proxy", "web_concurrency"}
        and not key.startswith("UVICORN_")
    }
    env.update(
        GRADIO_ANALYTICS_ENABLED="False",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_IMPLICIT_TOKEN="1",
        GRADIO_SERVER_NAME=HOST,
        GRADIO_SSR_MODE="False",
        NO_PROXY="*",
        no_proxy="*",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(
            p for p in (str(_REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    )
    return env


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when its parent thread dies."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


_spawner: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


_zygote: Zygote | None = None
_SERVE = ["-m", "devspaces", "serve"]


def _spawner_thread() -> ThreadPoolExecutor:
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="devspaces-spawn")
        return _spawner


def _popen(
    command: list[str], stdin: Any, log: IO[bytes], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Fork ``command`` from the long-lived spawner thread (see module docstring), in
    ``env`` (default :func:`child_env`)."""
    return (
        _spawner_thread()
        .submit(
            subprocess.Popen,
            command,
            stdin=stdin,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env() if env is None else env,
            cwd=_REPO_ROOT,
            start_new_session=False,
            preexec_fn=_die_with_parent(),  # safe here: see module docstring
        )
        .result()
    )


def _forking() -> Zygote:
    """This process's zygote (``_zygote``), started on first use or again if it died."""
    global _zygote
    with _zygote_lock:
        if _zygote is None or not _zygote.alive():
            if _zygote is not None:
                _zygote.close()
            log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the zygote
            command = [sys.executable, "-m", "devspaces", "zygote"]
            _zygote = Zygote(lambda sock: _popen(command, sock, log), log)
        return _zygote


_zygote_lock = threading.Lock()


@atexit.register
def _end_zygote() -> None:
    """At exit, the zygote ends its Spaces and is waited for (no zombie, CPU counted)."""
    if _zygote is not None:
        _zygote.close(wait_s=10.0)


def _spawn(command: list[str], log: IO[bytes]) -> subprocess.Popen[bytes] | ForkedSpace:
    """Start ``command``: a plain ``devspaces serve`` is forked by the zygote (no
    ``import gradio`` of its own; ``DEVSPACES_ZYGOTE=0`` turns that off), anything else
    (a Space in a network namespace, say) is its own process."""
    if command[1:4] == _SERVE and command[0] == sys.executable and _ZYGOTE_ON:
        return _forking().spawn(command[3:], child_env(), log)
    return _popen(command, subprocess.DEVNULL, log)


_ZYGOTE_ON = os.environ.get("DEVSPACES_ZYGOTE", "1") != "0"


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context per process (httpx's default: certifi's bundle). A client made
    without one loads the CA bundle again, ~25 ms of CPU, and a test polls stats() and
    control() hundreds of times; the Spaces are plain HTTP, the context is never used."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def _http() -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=httpx.Timeout(5.0), verify=_tls())


class SpaceProcess:
    """One stand-in Space in a child process on a fixed 127.0.0.1 port.

    Starts at construction and, unless ``wait=False``, returns once the Space answers.
    """

    def __init__(
        self,
        name: str = "alpha",
        *,
        port: int | None = None,
        config_delay_s: float = 0.0,
        concurrency_limit: int = 64,
        max_size: int | None = None,
        startup_timeout_s: float = 180.0,
        wait: bool = True,
        kind: str = "echo",
        login: bool = False,
    ) -> None:
        self.name = name
        self.kind = kind
        self.login = login  # behind Gradio's own login: LOGIN_USERS
        self.port = port if port is not None else free_port()
        self.config_delay_s = config_delay_s
        self.concurrency_limit = concurrency_limit
        self.max_size = max_size
        self.startup_timeout_s = startup_timeout_s
        self.app_id: int | None = None
        self._proc: subprocess.Popen[bytes] | ForkedSpace | None = None
        self._log: IO[bytes] | None = None
        # Until the Space first serves, a port we chose may be chosen again (a restart
        # keeps its URL, so it keeps its port).
        self._may_move = port is None
        self.start(wait=wait)

    @property
    def url(self) -> str:
        """Base URL with a trailing slash, as gradio_client and POOL_SPACES want it."""
        return f"http://{HOST}:{self.port}/"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"stand-in Space {self.name!r} is not started")
        return self._proc.pid

    def is_running(self) -> bool:
        """True while the child process exists (it may still be starting, or frozen)."""
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "devspaces", "serve",
            "--name", self.name,
            "--port", str(self.port),
            "--config-delay", repr(self.config_delay_s),
            "--concurrency", str(self.concurrency_limit),
            "--kind", self.kind,
        ]  # fmt: skip
        if self.max_size is not None:
            cmd += ["--max-size", str(self.max_size)]
        if self.login:
            cmd.append("--login")
        return cmd

    def start(self, *, wait: bool = True) -> None:
        """Spawn the child; with ``wait``, block until it serves (see ``wait_ready``)."""
        if self.is_running():
            raise RuntimeError(f"stand-in Space {self.name!r} is already running")
        self._close_log()
        self.app_id = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child
        self._proc = _spawn(self.command(), self._log)
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout_s: float | None = None) -> int:
        """Poll ``GET /gradio_api/app_id`` until it answers; return and remember the id."""
        proc = self._proc
        if proc is None:
            raise RuntimeError(f"stand-in Space {self.name!r} is not started")
        limit = self.startup_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        probe = f"{self.url}gradio_api/app_id"
        attempts = 1
        with _http() as http:
            while True:
                if proc.poll() is not None:
                    # A port free a moment ago (free_port) can be taken by another process
                    # before the child binds it: a port we chose is chosen again.
                    if (
                        self._may_move
                        and attempts < _PORT_ATTEMPTS
                        and "address already in use" in self.output_tail()
                    ):
                        attempts += 1
                        self.port = free_port()
                        probe = f"{self.url}gradio_api/app_id"
                        self.start(wait=False)
                        proc = self._proc
                        assert proc is not None
                        continue
                    raise SpaceStartError(
                        f"stand-in Space {self.name!r} exited with {proc.returncode} "
                        f"while starting on port {self.port}:\n{self.output_tail()}"
                    )
                with contextlib.suppress(httpx.TransportError):
                    response = http.get(probe, timeout=1.0)
                    if response.status_code == 200:
                        self.app_id = int(response.json()["app_id"])
                        self._may_move = False
                        return self.app_id
                if time.monotonic() > deadline:
                    tail = self.output_tail()
                    self.stop()
                    raise SpaceStartError(
                        f"stand-in Space {self.name!r} did not answer {probe} within "
                        f"{limit:.0f} s:\n{tail}"
                    )
                time.sleep(_POLL_S)

    def output_tail(self, limit: int = _STDERR_TAIL) -> str:
        """The last ``limit`` bytes the child wrote to stdout/stderr."""
        if self._log is None:
            return ""
        fd = self._log.fileno()
        size = os.fstat(fd).st_size
        start = max(0, size - limit)
        return os.pread(fd, size - start, start).decode(errors="replace")

    def kill(self, sig: int = signal.SIGKILL, *, wait: bool = True) -> None:
        """Send ``sig``; with ``wait`` (pass False for SIGSTOP), reap the child."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        if wait:
            proc.wait(timeout=10.0)

    def restart(self) -> int:
        """SIGKILL the child and start it again on the same port; return the new app_id."""
        self.kill(signal.SIGKILL)
        self.start(wait=True)
        assert self.app_id is not None
        return self.app_id

    def stop(self) -> None:
        """SIGTERM, wait a few seconds, then SIGKILL. Safe to call twice."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a frozen child cannot act on SIGTERM
            proc.terminate()
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                # A killed Space always ends, but a loaded 2-core box took over 5 s to
                # reap one (the suite at a load average of ~13): wait, do not give up.
                proc.wait(timeout=120.0)
        self._close_log()

    def stats(self) -> SpaceStats:
        return self._stand_in("GET", "stats")

    def intervals(self) -> list[tuple[float, float]]:
        """(start, end) wall-clock times of the calls that finished since the last reset."""
        with _http() as http:
            response = http.get(f"{self.url}_stand_in/intervals")
        response.raise_for_status()
        return [(float(a), float(b)) for a, b in response.json()]

    def calls(self) -> list[tuple[float, float, str]]:
        """(start, end, text) of the /echo calls that finished since the last reset, on
        the Space's own clock."""
        with _http() as http:
            response = http.get(f"{self.url}_stand_in/calls")
        response.raise_for_status()
        return [(float(a), float(b), str(t)) for a, b, t in response.json()]

    def reset(self) -> SpaceStats:
        """Zero peak, total and config_requests (peak restarts from calls in flight)."""
        return self._stand_in("POST", "reset")

    def control(
        self,
        *,
        config_delay_s: float | None = None,
        mode: Mode | None = None,
        config_429_s: float | None = None,
        require_token: str | None = None,
        refuse_next: int | None = None,
    ) -> SpaceStats:
        """Change how the running Space behaves; ``None`` leaves a setting as it is.

        ``config_429_s``: ``/config`` answers 429 with ``Retry-After`` for that long from
        now (a Hub rate limit); ``require_token``: every request needs
        ``x-hf-authorization: Bearer <token>`` or gets 401 (a private Space; "" opens it);
        ``refuse_next``: the next N queue joins get 503 "Queue is full" (a racy refusal)."""
        body: dict[str, Any] = {}
        if refuse_next is not None:
            body["refuse_next"] = refuse_next
        if config_429_s is not None:
            body["config_429_s"] = config_429_s
        if require_token is not None:
            body["require_token"] = require_token
        if config_delay_s is not None:
            body["config_delay_s"] = config_delay_s
        if mode is not None:
            body["mode"] = mode
        return self._stand_in("POST", "control", body)

    def _stand_in(self, method: str, route: str, body: dict[str, Any] | None = None) -> SpaceStats:
        with _http() as http:
            response = http.request(method, f"{self.url}_stand_in/{route}", json=body)
        response.raise_for_status()
        return SpaceStats(**response.json())

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<SpaceProcess {self.name} {self.url} {state}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class SpaceFleet:
    """Several stand-in Spaces started together, in parallel (a few seconds for three).

    Named alpha, beta, gamma, ... unless ``names`` is given (then ``count`` is ignored).
    ``kind`` is every Space's stand-in kind, or one kind per Space.
    """

    def __init__(
        self,
        count: int = 2,
        *,
        names: Sequence[str] | None = None,
        config_delay_s: float = 0.0,
        concurrency_limit: int = 64,
        max_size: int | None = None,
        startup_timeout_s: float = 180.0,
        kind: str | Sequence[str] = "echo",
    ) -> None:
        if names is None and count > len(DEFAULT_NAMES):
            raise ValueError(f"at most {len(DEFAULT_NAMES)} default names; pass names=")
        chosen = list(names) if names is not None else list(DEFAULT_NAMES[:count])
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"duplicate Space names: {chosen}")
        kinds = [kind] * len(chosen) if isinstance(kind, str) else list(kind)
        if len(kinds) != len(chosen):
            raise ValueError(f"{len(kinds)} kinds for {len(chosen)} Spaces")
        self.spaces: list[SpaceProcess] = []
        try:
            # Spawn all first, then wait for all: they start in parallel.
            for name, kind_of_space in zip(chosen, kinds, strict=True):
                self.spaces.append(
                    SpaceProcess(
                        name,
                        config_delay_s=config_delay_s,
                        concurrency_limit=concurrency_limit,
                        max_size=max_size,
                        startup_timeout_s=startup_timeout_s,
                        wait=False,
                        kind=kind_of_space,
                    )
                )
            for space in self.spaces:
                space.wait_ready()
        except BaseException:
            self.stop()
            raise

    @property
    def urls(self) -> list[str]:
        return [space.url for space in self.spaces]

    def __getitem__(self, name: str) -> SpaceProcess:
        for space in self.spaces:
            if space.name == name:
                return space
        raise KeyError(name)

    def __iter__(self) -> Iterator[SpaceProcess]:
        return iter(self.spaces)

    def __len__(self) -> int:
        return len(self.spaces)

    def pool_spaces_env(self) -> str:
        """The POOL_SPACES value: ``alpha=http://127.0.0.1:P1/,beta=http://127.0.0.1:P2/``."""
        return ",".join(f"{space.name}={space.url}" for space in self.spaces)

    def concurrent_peak(self) -> int:
        """The most calls that ran at the same moment across every Space of the fleet,
        from the intervals the Spaces recorded (finished calls since the last reset)."""
        events: list[tuple[float, int]] = []
        for space in self.spaces:
            for start, end in space.intervals():
                events += [(start, 1), (end, -1)]
        # Ends sort before starts at the same instant: touching calls do not overlap.
        events.sort(key=lambda e: (e[0], e[1]))
        peak = running = 0
        for _, delta in events:
            running += delta
            peak = max(peak, running)
        return peak

    def reset(self) -> None:
        for space in self.spaces:
            space.reset()

    def stop(self) -> None:
        """Stop every Space (SIGTERM all first, so they shut down in parallel)."""
        for space in self.spaces:
            space.kill(signal.SIGCONT, wait=False)
            space.kill(signal.SIGTERM, wait=False)
        for space in self.spaces:
            space.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
