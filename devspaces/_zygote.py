"""Fork stand-in Spaces from one process that has imported Gradio already (a zygote).

A Space's start is mostly ``import gradio`` (~2.5 s of CPU; building the Blocks and
serving it ~0.25 s), and the suite starts about eighty Spaces on 2 cores. The zygote is
``python -m devspaces zygote``: it imports uvicorn and ``devspaces._app`` once, then
forks a child per Space, which runs ``devspaces serve`` as the plain command would.

Nothing else changes for a test: each Space is still its own process on its own port,
killed, frozen and restarted with real signals (``os.kill`` on its pid); only its parent
is the zygote instead of the test process.

Protocol (one ``socketpair``; the zygote's end is its stdin): the test process sends
``{"argv": [...], "env": {...}}`` with the Space's log file as an ``SCM_RIGHTS`` fd and
gets ``{"pid": N}``; the zygote reaps its children (SIGCHLD, through a wakeup fd) and
sends ``{"exit": N, "rc": C}`` (``rc`` as ``Popen.returncode``: ``-signum`` when killed).

No orphans: the zygote is forked by the launcher's spawner thread with
``PR_SET_PDEATHSIG`` (see ``_launch``), and each child asks for SIGKILL when the zygote
goes, so a test process killed with SIGKILL still takes every Space with it. The zygote
forks from its only thread (importing gradio starts none), so no lock is held at fork.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

_MAX_MESSAGE = 1 << 20
_ANSWER_S = 180.0  # the zygote's first answer waits for its imports on a loaded machine


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode() + b"\n"
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


# The zygote ---------------------------------------------------------------------------


def serve_forever(control: socket.socket, run: Callable[[list[str]], int] | None = None) -> int:
    """The zygote's loop: fork a child per request, report each child's exit. A child
    runs ``run(argv)`` (by default ``devspaces``' command line: a Space); the caller
    has imported what its children share (the tests' service zygote, ``tests/_prefork.py``)."""
    if run is None:
        import uvicorn  # noqa: F401 - imported once here, used by every child

        import devspaces._app  # noqa: F401 - gradio and the stand-in kinds
        from devspaces import __main__ as cli

        run = cli.main
    die_with_parent = _pdeathsig()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ, "control")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    buffered = b""
    fds: list[int] = []
    children: set[int] = set()
    while True:
        for key, _ in selector.select():
            if key.data == "child":
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                children -= _reap(control)
                continue
            data, more_fds, _, _ = socket.recv_fds(control, _MAX_MESSAGE, 4)
            if not data:  # the test process closed its end: end its Spaces, then us
                for pid in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                for pid in children:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, 0)
                return 0
            buffered += data
            fds += more_fds
            if b"\n" not in buffered:
                continue  # the rest of the request is on its way
            line, _, buffered = buffered.partition(b"\n")
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:  # the Space
                code = 1
                try:
                    selector.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(wake_r)
                    os.close(wake_w)
                    control.close()
                    die_with_parent()
                    log = fds[0]
                    null = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(null, 0)
                    os.dup2(log, 1)
                    os.dup2(log, 2)
                    os.close(null)
                    os.close(log)
                    os.environ.clear()
                    os.environ.update(request["env"])
                    sys.argv = ["devspaces", *request["argv"]]
                    code = run(request["argv"])
                    atexit._run_exitfuncs()  # what a plain `devspaces serve` runs at exit
                except SystemExit as stop:
                    code = stop.code if isinstance(stop.code, int) else 1
                except BaseException:
                    import traceback

                    traceback.print_exc()
                finally:
                    with contextlib.suppress(BaseException):
                        sys.stdout.flush()
                        sys.stderr.flush()
                    os._exit(code)
            for fd in fds:
                os.close(fd)
            fds = []
            children.add(pid)
            _send(control, {"pid": pid})


def _reap(control: socket.socket) -> set[int]:
    """Wait for every child that ended; report each; return their pids."""
    ended: set[int] = set()
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.add(pid)
        with contextlib.suppress(OSError):
            _send(control, {"exit": pid, "rc": os.waitstatus_to_exitcode(status)})


def _pdeathsig() -> Any:
    """A function that asks for SIGKILL when this process's parent (the zygote) goes."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    zygote = os.getpid()

    def arm() -> None:
        prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != zygote:
            os._exit(1)

    return arm


def main() -> int:
    """``python -m devspaces zygote``: the control socket is fd 0."""
    control = socket.socket(fileno=0)
    return serve_forever(control)


# The test process's side ----------------------------------------------------------------


class ForkedSpace:
    """A Space forked by the zygote: the part of ``subprocess.Popen`` that ``_launch``
    uses (``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``,
    ``kill``)."""

    def __init__(self, pid: int, zygote: Zygote) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._zygote = zygote
        self._ended = threading.Event()
        # The zygote, not this process, reaps the child: once it has, the pid is free, and
        # this machine wraps its 32,768 pids within one run of the suite (threads take
        # pids too). A signal sent by pid could then reach an unrelated process; one sent
        # through a pidfd, opened while the child runs, only ever reaches this child.
        self._signals = threading.Lock()
        self._pidfd: int | None = None
        with contextlib.suppress(OSError):  # already gone: no signal will be sent
            self._pidfd = os.pidfd_open(pid)

    def _exited(self, code: int) -> None:
        with self._signals:
            self.returncode = code
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        self._ended.set()

    def poll(self) -> int | None:
        if self.returncode is None and not self._zygote.alive():
            self._exited(-signal.SIGKILL)  # the zygote's children die with it
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        if not self._ended.wait(timeout) and self.poll() is None:
            raise subprocess.TimeoutExpired(["devspaces", str(self.pid)], timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        with self._signals:
            if self.returncode is None and self._pidfd is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The test process's handle on its zygote: ``spawn(argv, env, log)``."""

    def __init__(self, start: Any, log: IO[bytes]) -> None:
        self._log = log  # the zygote's own output (a failed import, say)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = start(theirs)
        finally:
            theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        self._replies: list[int] = []
        self._reply = threading.Condition()
        self._children: dict[int, ForkedSpace] = {}
        self._early: dict[int, int] = {}
        self._reader = threading.Thread(target=self._read, name="devspaces-zygote", daemon=True)
        self._reader.start()

    def alive(self) -> bool:
        return bool(self._proc.poll() is None and self._reader.is_alive())

    def spawn(self, argv: list[str], env: dict[str, str], log: IO[bytes]) -> ForkedSpace:
        with self._lock:
            _send(self._sock, {"argv": argv, "env": env}, [log.fileno()])
            with self._reply:
                answered = self._reply.wait_for(
                    lambda: self._replies or not self.alive(), _ANSWER_S
                )
                if not answered or not self._replies:
                    raise RuntimeError(
                        "the devspaces zygote did not fork a Space "
                        f"({'no answer' if not answered else 'it is gone'}):\n{self.output()}"
                    )
                pid = self._replies.pop(0)
                child = ForkedSpace(pid, self)
                self._children[pid] = child
                if pid in self._early:
                    child._exited(self._early.pop(pid))
                return child

    def _read(self) -> None:
        buffered = b""
        try:
            while True:
                try:
                    data = self._sock.recv(65536)
                except OSError:  # closed by close() while this read: the end, as EOF
                    break
                if not data:
                    break
                buffered += data
                while b"\n" in buffered:
                    line, _, buffered = buffered.partition(b"\n")
                    message = json.loads(line)
                    with self._reply:
                        if "pid" in message:
                            self._replies.append(int(message["pid"]))
                            self._reply.notify_all()
                        elif (child := self._children.pop(int(message["exit"]), None)) is None:
                            self._early[int(message["exit"])] = int(message["rc"])
                        else:
                            child._exited(int(message["rc"]))
        finally:
            with self._reply:
                for child in self._children.values():
                    child._exited(-signal.SIGKILL)
                self._children.clear()
                self._reply.notify_all()

    def output(self, limit: int = 4000) -> str:
        fd = self._log.fileno()
        size = os.fstat(fd).st_size
        start = max(0, size - limit)
        return os.pread(fd, size - start, start).decode(errors="replace")

    def close(self, wait_s: float = 0.0) -> None:
        """Close the socket: the zygote kills its Spaces and ends (waited for ``wait_s``)."""
        with contextlib.suppress(OSError):
            self._sock.close()
        if wait_s:
            with contextlib.suppress(Exception):
                self._proc.wait(timeout=wait_s)
        self._log.close()
