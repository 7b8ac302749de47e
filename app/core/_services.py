"""The service's parts, reached from a request by one typed helper.

The lifespan (``app/main.py``) builds the parts — the key store, the usage meter, the job
runner, the file store, the trust boundary, the Gradio front's sessions — and provides
each to the app's :class:`Services`; a route asks for the one it needs by its class:
``services_of(request).get(Keys)`` is a ``Keys`` to the type checker. The parts belong to
the folders that define them, so this module names none of their types (it sits below
them all); the settings, known before the lifespan, are a field of their own.
"""

from __future__ import annotations

from typing import TypeVar, cast

from starlette.applications import Starlette
from starlette.requests import HTTPConnection

from ._settings import ServiceSettings

T = TypeVar("T")


class Services:
    """One part per class, provided at start and asked for by class."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self._parts: dict[type, object] = {}

    def provide(self, part: T, kind: type[T] | None = None) -> T:
        """Keep ``part`` under ``kind`` (default: its own class); returns it."""
        self._parts[kind or type(part)] = part
        return part

    def get(self, kind: type[T]) -> T:
        """The part of class ``kind``; LookupError when the service has not started."""
        part = self._parts.get(kind)
        if part is None:
            raise LookupError(f"no {kind.__name__}: the service has not started")
        return cast(T, part)

    def find(self, kind: type[T]) -> T | None:
        """The part of class ``kind``, or None (an app whose lifespan has not run)."""
        return cast("T | None", self._parts.get(kind))


def services_of(where: HTTPConnection | Starlette) -> Services:
    """The services of the app serving ``where`` (a request), or of the app itself."""
    app = where.app if isinstance(where, HTTPConnection) else where
    services: Services = app.state.services
    return services


def settings_of(request: HTTPConnection) -> ServiceSettings:
    """The running service's settings (given to the app when it was made)."""
    return services_of(request).settings
