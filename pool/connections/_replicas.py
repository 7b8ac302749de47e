"""The ``app_id`` values a Space's replicas answered with: which answer is a restart.

Gradio draws an ``app_id`` at random when an app starts, so a new one means a process
that was not there before. A replicated Space (several replicas behind one address on
the Hub) answers with as many ``app_id`` values as it has replicas: which one a request
gets depends on the replica it reached. The pool's own requests (``/config``, the
``app_id`` check of a new connection, health probes) carry the Space's home cookies
(pool/transport/_affinity.py) and keep reaching one replica; an upstream session's first
request may reach any.

The rule: an ``app_id`` already seen on this Space is a known replica, never a restart
(a probe routed to another live replica rebuilds nothing). One never seen is a restart
when the pool's own requests read it (the replica they reach is a new process: rebuild
the connections), and a newly met replica when a session's first request read it
(:meth:`Replicas.note`). Old ``app_id`` values age out (the last :data:`KEEP` are kept).
"""

from __future__ import annotations

KEEP = 16


class Replicas:
    """The ``app_id`` values seen on one Space, most recently seen last."""

    def __init__(self) -> None:
        self._seen: dict[object, None] = {}

    def known(self, app_id: object) -> bool:
        return app_id in self._seen

    def note(self, app_id: object) -> None:
        """``app_id`` answered (a known replica from now on)."""
        if app_id is None:
            return
        self._seen.pop(app_id, None)
        self._seen[app_id] = None
        while len(self._seen) > KEEP:
            del self._seen[next(iter(self._seen))]

    def is_restart(self, app_id: object) -> bool:
        """Whether ``app_id``, read by the pool's own request, is a process never seen
        (then noted)."""
        new = app_id is not None and app_id not in self._seen
        self.note(app_id)
        return new

    def __len__(self) -> int:
        return len(self._seen)
