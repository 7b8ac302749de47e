"""The Gradio front: unmodified ``gradio_client`` and ``@gradio/client`` code pointed at
``/gradio/{alias}/`` (one Space) or ``/gradio/`` (the pool's Spaces, replicas of one
app) gets pooling, session pinning, admission and failover.

* :mod:`._routes` — the Gradio routes, answered as a Space answers them;
* :mod:`._rest` — the REST form, ``call/{api_name}``;
* :mod:`._login` — Gradio's own login, for a Space behind one;
* :mod:`._front_sessions` — a client's session: the pool's session, its events queued
  in the pool's queue and relayed;
* :mod:`._messages` — a session's messages, in the coordinator (any worker reads them):
  the one place they are published and read;
* :mod:`._space_view` — the Spaces' config, API and files (no admission);
* :mod:`._rewrite` — no Space address reaches the caller.
"""

from ._front_sessions import FrontSessions
from ._routes import event_of, router

__all__ = ["FrontSessions", "event_of", "router"]
