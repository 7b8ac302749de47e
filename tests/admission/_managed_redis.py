"""Managed Redis shapes of the test's own: a 3-master cluster, a master with a replica
watched by sentinels, a TLS server. Real redis-server processes on free loopback
ports, each in a temporary directory; :class:`Servers` kills them and removes the
directory whatever happens (used as a context manager by the fixtures)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import pytest
import redis

from devspaces import free_port


def require_redis_server() -> None:
    """Skip (locally) or fail (CI) without redis-server and redis-cli."""
    if shutil.which("redis-server") and shutil.which("redis-cli"):
        return
    if os.environ.get("CI"):
        pytest.fail("redis-server/redis-cli not installed; CI runs the managed Redis tests")
    pytest.skip("redis-server/redis-cli not installed")


class Servers:
    """redis-server processes in one temporary directory, all gone on exit."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="spacepool-redis-"))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> Servers:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for port in list(self.procs):
            self.kill(port)
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, *args: str, port: int | None = None, conf: str = "") -> int:
        """A redis-server (``conf``: a config file's text, for sentinels) on ``port``."""
        port = port or free_port()
        where = self.dir / str(port)
        where.mkdir()
        cmd = [shutil.which("redis-server") or "redis-server"]
        if conf:
            (where / "redis.conf").write_text(conf)
            cmd.append(str(where / "redis.conf"))
        cmd += ["--bind", "127.0.0.1", "--dir", str(where), "--save", "", "--appendonly", "no"]
        if "--tls-port" not in args:
            cmd += ["--port", str(port)]
        cmd += list(args)
        self.procs[port] = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        return port

    def start_retrying(self, args: Callable[[str], tuple[str, ...]]) -> int:
        """A server with ``args(another free port)``, answering; started again on new
        ports if a port was taken meanwhile (other processes of the machine pick theirs)."""
        for attempt in range(3):
            port = self.start(*args(str(free_port())))
            try:
                self.wait_ping(port)
                return port
            except AssertionError:
                self.kill(port)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def wait_ping(self, port: int, *, ca: str | None = None) -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2,
                                 ssl=ca is not None,
                                 ssl_ca_certs=ca) as r:  # fmt: skip
                    r.ping()
                return
            except redis.ConnectionError:
                assert self.procs[port].poll() is None, f"redis-server :{port} exited"
                assert time.monotonic() < deadline, f"redis-server :{port} did not start"
                time.sleep(0.02)


def start_cluster(servers: Servers, masters: int = 3) -> list[int]:
    """``masters`` cluster nodes, joined and covering every slot: their ports."""
    # The bus port is named: the default, port + 10000, is past 65535 for many free ports.
    ports = [
        servers.start_retrying(lambda bus: ("--cluster-enabled", "yes", "--cluster-port", bus,
                               "--cluster-node-timeout", "2000", "--cluster-config-file",
                               "nodes.conf"))
        for _ in range(masters)
    ]  # fmt: skip
    subprocess.run(
        ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
         "--cluster-yes"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30,
    )  # fmt: skip
    deadline = time.monotonic() + 15
    for port in ports:
        with redis.Redis(port=port, decode_responses=True) as r:
            while r.cluster("info")["cluster_state"] != "ok":
                assert time.monotonic() < deadline, "the cluster did not come up"
                time.sleep(0.05)
    return ports


def slot_owner(ports: list[int], key: str) -> int:
    """The port of the master that serves ``key``'s slot."""
    with redis.Redis(port=ports[0], decode_responses=True) as r:
        slot = int(r.cluster("keyslot", key))
        for first, last, master, *_ in r.execute_command("CLUSTER SLOTS"):
            if int(first) <= slot <= int(last):
                return int(master[1])
    raise AssertionError(f"no master serves slot {slot}")


def start_sentinels(servers: Servers, service: str, count: int = 3) -> tuple[int, int, list[int]]:
    """A master, its replica and ``count`` sentinels (quorum 2) that know each other
    and the replica: (master port, replica port, sentinel ports)."""
    master = servers.start()
    servers.wait_ping(master)
    replica = servers.start("--replicaof", "127.0.0.1", str(master))
    servers.wait_ping(replica)
    sentinels = []
    for _ in range(count):
        port = free_port()
        conf = (
            f"port {port}\nsentinel monitor {service} 127.0.0.1 {master} 2\n"
            f"sentinel down-after-milliseconds {service} 1000\n"
            f"sentinel failover-timeout {service} 2000\n"  # a failed election: again in 4 s
            f"logfile {servers.dir / f'sentinel-{port}.log'}\n"
        )
        sentinels.append(servers.start("--sentinel", port=port, conf=conf))
    deadline = time.monotonic() + 20
    for port in sentinels:
        servers.wait_ping(port)
        with redis.Redis(port=port, decode_responses=True) as r:
            while (len(r.execute_command("SENTINEL", "SENTINELS", service)) < count - 1
                   or not r.execute_command("SENTINEL", "REPLICAS", service)):  # fmt: skip
                assert time.monotonic() < deadline, "the sentinels did not meet"
                time.sleep(0.1)
    return master, replica, sentinels


def sentinel_logs(servers: Servers) -> str:
    """The sentinels' logs, last lines (for a failure's message)."""
    return "\n".join(
        line for log in sorted(servers.dir.glob("sentinel-*.log"))
        for line in log.read_text(errors="replace").splitlines()[-15:]
    )  # fmt: skip


def make_tls(where: Path) -> dict[str, str]:
    """A throwaway certificate authority and a server certificate for 127.0.0.1."""
    names = ("ca.key", "ca.crt", "server.key", "server.csr", "server.crt")
    ca_key, ca, key, csr, cert = (str(where / name) for name in names)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30)  # fmt: skip

    openssl("req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "1",
            "-subj", "/CN=spacepool test CA")  # fmt: skip
    openssl("req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1")
    (where / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
            "-out", cert, "-days", "1", "-extfile", str(where / "ext.cnf"))  # fmt: skip
    return {"ca": ca, "cert": cert, "key": key}
