"""Hosts in network namespaces on one bridge, and partitions that drop packets.

``NetLab(["redis", "space", "h1", "h2"])`` makes one namespace per node, each with a
veth into a bridge in the test's own namespace (which reaches every node at
``10.<n>.<m>.1``). Every node knows every other node's MAC as a *permanent*
neighbour entry, so a partition is made by pointing the entry at a MAC nobody owns:
the frames still leave, the bridge floods them, and every interface drops them
(PACKET_OTHERHOST). Packets are dropped both ways, never refused (no RST, no ICMP,
no ARP failure turning into EHOSTUNREACH), which is what a partition is.

Why not ``tc``: the kernel of this machine has no netem qdisc and no classifier
(u32, matchall and flower answer "not found"), so tc cannot drop anything here; a
neighbour entry can, per pair of nodes.

Everything is named after the test's pid and removed by :meth:`down` (processes in
the namespaces must be ended first, or a namespace outlives its name).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

_NOWHERE = "02:00:5e:00:22:22"  # a locally administered MAC that no interface has


def _ip(*args: str, ns: str | None = None, check: bool = True) -> str:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done.stdout


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs this test as root)"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    probe = f"sp{os.getpid() % 100000}probe"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"cannot create a network namespace: {exc}"
    _ip("netns", "del", probe, check=False)
    return None


class NetLab:
    """Nodes in namespaces on one bridge; :meth:`cut` and :meth:`heal` node pairs."""

    def __init__(self, nodes: Sequence[str]) -> None:
        pid = os.getpid()
        self.tag = f"sp{pid % 100000}"
        net = f"10.{200 + pid % 50}.{(pid // 50) % 250}"
        self.bridge = f"{self.tag}br"
        self.gateway = f"{net}.1"
        self.nodes = list(nodes)
        self.ns = {n: f"{self.tag}-{n}" for n in nodes}
        self.ip = {n: f"{net}.{i + 2}" for i, n in enumerate(nodes)}
        self._outer = {n: f"{self.tag}v{i}" for i, n in enumerate(nodes)}
        self.mac: dict[str, str] = {}

    def up(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for node in self.nodes:
            ns, outer = self.ns[node], self._outer[node]
            _ip("netns", "add", ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", outer, "master", self.bridge, "up")
            _ip("addr", "add", f"{self.ip[node]}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            self.mac[node] = _ip("-br", "link", "show", "eth0", ns=ns).split()[2]
        for node in self.nodes:
            for peer in self.nodes:
                if peer != node:
                    self._point(node, peer, self.mac[peer])

    def _point(self, node: str, peer: str, mac: str) -> None:
        _ip("neigh", "replace", self.ip[peer], "lladdr", mac, "dev", "eth0", "nud",
            "permanent", ns=self.ns[node])  # fmt: skip

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between ``a`` and ``b``, both ways."""
        self._point(a, b, _NOWHERE)
        self._point(b, a, _NOWHERE)

    def heal(self, a: str, b: str) -> None:
        self._point(a, b, self.mac[b])
        self._point(b, a, self.mac[a])

    def exec(self, node: str) -> list[str]:
        """The command prefix that runs a program in ``node``'s namespace."""
        return ["ip", "netns", "exec", self.ns[node]]

    def down(self) -> None:
        """Remove every namespace and the bridge (their veths go with them)."""
        for ns in self.ns.values():
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)
        for outer in self._outer.values():
            _ip("link", "del", outer, check=False)
