"""Routing: which Space serves a call (docs/architecture.md, the ``routing`` layer).

* :mod:`._choice` — :class:`Choice`: the Space of an attempt (a named one, the user's pin,
  a breaker's half-open probe, else round robin / least loaded among those up);
* :mod:`._routing` — sticky pins with a TTL and round robin for new users (seed 003);
* :mod:`._apps` — apps and replicas (Spaces with identical APIs, or ``alias@app``) and
  the ambiguity check for a call that names no Space;
* :mod:`._scheduling` — priority classes of requests (docs/scheduling.md).

It reads the connections layer (each Space's :class:`~pool.connections.SpacePool`
load and API) and the shared health board; it never calls back into the pool.
"""

from __future__ import annotations

from ._apps import Apps
from ._choice import Choice, Route
from ._routing import Router, user_key
from ._scheduling import classed_ticket, queue_timeout_for

__all__ = ["Apps", "Choice", "Route", "Router", "classed_ticket", "queue_timeout_for", "user_key"]
