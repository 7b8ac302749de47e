"""The Gradio front: unmodified ``gradio_client`` and ``@gradio/client`` code pointed at
``/gradio/{alias}/`` (one Space) or ``/gradio/`` (the pool's Spaces, replicas of one
app) gets pooling, session pinning, admission and failover.

* :mod:`._routes` — the Gradio routes, answered as a Space answers them;
* :mod:`._rest` — the REST form, ``call/{api_name}``;
* :mod:`._login` — Gradio's own login, for a Space behind one;
* :mod:`._front_sessions` — every session relayed by this process, within caps;
* :mod:`._front_session` — one client's session: the pool's session, its events, its
  cancels, the watch of its record;
* :mod:`._front_event` — one event: a pool call (``Pool.call``) whose attempts join it
  at the admitted Space and relay its messages;
* :mod:`._event_request` — a join body made into an event (checked);
* :mod:`._handover` — joins handed to the worker running the session's events;
* :mod:`._fleet` — what a session keeps in the coordinator beside its messages;
* :mod:`._front_errors` — the front's own refusals;
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
from ._routes import router

__all__ = ["FrontCors", "FrontSessions", "pages_router", "router"]
