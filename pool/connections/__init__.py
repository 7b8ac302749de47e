"""Connections: the pooled connections of each Space (docs/architecture.md).

* :mod:`._space_pool` — one Space's connections in this process: lazy start, growth to
  the maximum, FIFO hand-off to waiters, reaping, generations (a restart rebuilds them);
* :mod:`._connection` — one connection: a :class:`~pool.transport.SpaceClient` with its
  bookkeeping;
* :mod:`._handle` — the leased handle (:class:`PooledClient`) and its jobs: deadlines,
  partials, events, fencing, downloads;
* :mod:`._downloads` — Gradio FileData in results: found, fetched (bounded), ``LocalFile``;
* :mod:`._cancels` — upstream cancels delivered until the Space confirms them;
* :mod:`._failover` — the one failure path: a failed Space is routed around for a
  cool-down (called by every layer above that meets a failure; it calls nothing back);
* :mod:`._guard` — the outbound secret guard (linear time);
* :mod:`._warmth`, :mod:`._replicas` — connections kept warm; which ``app_id`` is a
  restart and which another replica.

Everything here holds the transport's interface only; it never asks which transport.
"""

from __future__ import annotations

from ._connection import Connection
from ._downloads import LocalFile, files_in, is_file_data
from ._failover import Failover
from ._guard import check_outbound
from ._handle import Partial, PooledClient, PooledJob
from ._space_pool import SpacePool
from ._warmth import Warmth

__all__ = [
    "Connection",
    "Failover",
    "LocalFile",
    "Partial",
    "PooledClient",
    "PooledJob",
    "SpacePool",
    "Warmth",
    "check_outbound",
    "files_in",
    "is_file_data",
]
