"""The Redis store's connections: which client a URL names, and an abandoned
connection is reset, not closed.

URL forms (``POOL_COORDINATOR_URL``; our own query options, such as ``prefix``, are
removed before this module sees the URL):

* ``redis://[user:password@]host:port/db``, ``rediss://…`` (TLS), ``unix://…``: one
  server, ``redis.asyncio.Redis`` (a cluster node behind such a URL is found by the
  store's first call, which goes on with the cluster client).
* ``redis+cluster://[user:password@]host:port[,host:port]/`` (``rediss+cluster://``:
  TLS): a Redis Cluster, ``redis.asyncio.cluster.RedisCluster``, started from any of
  the nodes named. Every key of the store shares one hash slot: the key prefix carries
  a hash tag (:func:`cluster_prefix`).
* ``redis+sentinel://[user:password@]host:port[,host:port]/service/db``
  (``rediss+sentinel://``: TLS to the master; the sentinels are asked in clear): the
  master of ``service`` as the sentinels name it, found again after a failover.

A certificate authority for TLS: ``POOL_COORDINATOR_CA_FILE`` (a PEM file), else the
system's.

redis-py closes a connection whose reply did not come within ``socket_timeout``. A
graceful close (FIN) leaves what the kernel had not delivered in its send queue, and
the kernel keeps retransmitting it: after a partition heals, a command the client gave
up on long ago reaches Redis and runs (seen: an enqueue 7 s after the heal, after its
waiter had been withdrawn on a new connection). With ``SO_LINGER`` on and a linger
time of 0, ``close()`` sends a reset and the kernel drops that queue (socket(7)).
Every close of these connections is a reset: a normal close happens only once every
reply is in, so nothing is lost by it.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    Sentinel,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.backoff import NoBackoff

_LINGER_RESET = struct.pack("ii", 1, 0)  # struct linger {l_onoff = 1, l_linger = 0}


class _ResetMixin:
    _writer: Any

    async def _connect(self) -> None:
        await super()._connect()  # type: ignore[misc]  # untyped in redis-py
        writer = self._writer
        sock = writer.transport.get_extra_info("socket") if writer is not None else None
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)


class ResetOnClose(_ResetMixin, Connection):
    """A TCP connection to Redis whose close discards anything still unsent."""


class _ResetOnCloseTLS(_ResetMixin, SSLConnection):
    """The same, over TLS."""


class _SentinelResetOnClose(_ResetMixin, SentinelManagedConnection):
    """The same, to the master a sentinel names."""


class _SentinelResetOnCloseTLS(_ResetMixin, SentinelManagedSSLConnection):
    """The same, over TLS."""


Client = Redis | RedisCluster
"""What the store talks to: one server (also a sentinel's master) or a cluster."""


@dataclass(frozen=True)
class Target:
    """Where a ``POOL_COORDINATOR_URL`` points (no password in :attr:`where`)."""

    kind: str  # "single", "cluster" or "sentinel"
    url: str  # the single server's URL, as redis-py reads it
    where: str  # host:port[,host:port] for messages and logs
    tls: bool = False
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)


def parse_target(url: str) -> Target:
    """Read the URL forms of the module docstring."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    userinfo, _, hosts = parts.netloc.rpartition("@")
    if scheme in {"redis", "rediss", "unix"}:
        return Target("single", url, hosts or parts.path, tls=scheme == "rediss")
    base, _, kind = scheme.partition("+")
    if base not in {"redis", "rediss"} or kind not in {"cluster", "sentinel"}:
        raise ValueError(f"unsupported POOL_COORDINATOR_URL scheme {scheme!r}")
    user, _, password = userinfo.partition(":")
    nodes = tuple(_host_port(node) for node in hosts.split(",") if node.strip())
    if not nodes:
        raise ValueError(f"POOL_COORDINATOR_URL ({scheme}) names no host:port")
    path = [unquote(p) for p in parts.path.split("/") if p]
    service, db = "", 0
    if kind == "sentinel":
        if not path or len(path) > 2:
            raise ValueError("POOL_COORDINATOR_URL: redis+sentinel://host:port[,…]/service/db")
        service, db = path[0], int(path[1]) if len(path) == 2 else 0
    elif path and path != ["0"]:
        raise ValueError("POOL_COORDINATOR_URL: a Redis Cluster has database 0 only")
    return Target(
        kind, url, hosts, tls=base == "rediss", nodes=nodes, service=service, db=db,
        username=unquote(user) or None, password=unquote(password) or None,
    )  # fmt: skip


def _host_port(node: str) -> tuple[str, int]:
    host, _, port = node.strip().rpartition(":")
    if not host:
        return node.strip(), 6379
    return host.strip("[]"), int(port)


def cluster_prefix(prefix: str) -> str:
    """``prefix`` with a hash tag, so that every key under it is in one hash slot (a
    script's keys must be). A prefix that has one (``{spacepool}:``) is kept;
    ``spacepool:`` becomes ``{spacepool:}``."""
    start = prefix.find("{")  # Redis hashes what is between the first { and the next }
    if start >= 0 and prefix.find("}", start + 1) > start + 1:
        return prefix
    return "{" + prefix + "}"


def open_client(
    target: Target, *, timeout_s: float, lease_ttl_s: float, ca_file: str | None
) -> tuple[Client, Callable[[], Awaitable[None]]]:
    """The client ``target`` names, failing fast (short timeouts, no retries), and
    what closes it (with a sentinel's own connections)."""
    common: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": max(5, int(lease_ttl_s)),
    }
    tls: dict[str, Any] = {"ssl_ca_certs": ca_file} if ca_file else {}
    if target.kind == "single":
        # A redis:// or rediss:// URL's connections are reset when abandoned. The class
        # given here wins over the URL's: a rediss:// URL needs the TLS one.
        scheme = urlsplit(target.url).scheme.lower()
        if scheme == "unix":
            client = Redis.from_url(target.url, **common)
        else:
            cls = _ResetOnCloseTLS if target.tls else ResetOnClose
            client = Redis.from_url(
                target.url, connection_class=cls, **common, **(tls if target.tls else {})
            )
        return client, client.aclose
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.kind == "cluster":
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
            ssl=target.tls, **auth, **common, **(tls if target.tls else {}),
        )  # fmt: skip
        return cluster, cluster.aclose
    sentinel = Sentinel(
        list(target.nodes),
        sentinel_kwargs={"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s},
        socket_timeout=timeout_s,
    )
    managed = _SentinelResetOnCloseTLS if target.tls else _SentinelResetOnClose
    kwargs = {**common, **auth, "db": target.db, "connection_class": managed}
    if target.tls:
        kwargs.update(tls)
    master: Redis = sentinel.master_for(target.service, redis_class=Redis, **kwargs)

    async def close() -> None:
        await master.aclose()
        for each in sentinel.sentinels:
            await each.aclose()

    return master, close
