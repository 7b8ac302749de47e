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
* :mod:`._rewrite` — no Space address reaches the caller;
* :mod:`._pages` — the Spaces' own web pages for browsers (``POOL_GRADIO_PAGES``), and
  :mod:`._run` — the events a page runs outside its queue, as pool calls;
* :mod:`._visitors` — a page's visitor (a signed cookie); :mod:`._cors` — CORS for
  pages on other origins.
"""

from ._cors import FrontCors
from ._front_sessions import FrontSessions
from ._pages import router as pages_router
from ._routes import event_of, router

__all__ = ["FrontCors", "FrontSessions", "event_of", "pages_router", "router"]
