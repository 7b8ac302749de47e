"""The Gradio front: unmodified ``gradio_client`` and ``@gradio/client`` code pointed at
``/gradio/{alias}/`` (one Space) or ``/gradio/`` (the pool's Spaces, replicas of one
app) gets pooling, session pinning, admission and failover.

* :mod:`._routes` — the Gradio routes, answered as a Space answers them;
* :mod:`._rest` — the REST form, ``call/{api_name}``;
* :mod:`._session` — downstream sessions pinned to an upstream Space and session;
* :mod:`._upstream` — the Spaces' config, API and files (no admission);
* :mod:`._rewrite` — no Space address reaches the caller.
"""

from ._routes import router
from ._session import FrontSessions

__all__ = ["FrontSessions", "router"]
