"""A pytest plugin (``-p scripts._conformance_front``): every Gradio app a test launches
is reached through a spacepool service's front instead of directly.

``gradio.Blocks.launch`` is wrapped: the app starts as usual on 127.0.0.1, then a service
(``uvicorn app.main:app``, :class:`tests.service.conftest.ServiceProcess`) is started with
``POOL_SPACES=demo=<the app's URL>`` (and ``POOL_SPACE_AUTH`` from ``launch(auth=...)``),
and the URL ``launch`` returns is the service's ``/gradio/demo/``: gradio_client's tests
(``connect()``, or their own ``demo.launch``) then talk to the front. ``Blocks.close``
stops that service. No test file is changed.
"""

from __future__ import annotations

import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

import gradio as gr
import pytest

from tests.service.conftest import ServiceProcess, service_env

_services: dict[int, ServiceProcess] = {}  # by id() of the launched Blocks
_folder = Path(tempfile.mkdtemp(prefix="spacepool-conformance-front-"))
_launch = gr.Blocks.launch
_close = gr.Blocks.close


def _login(auth: Any) -> str | None:
    """``launch(auth=...)`` as ``POOL_SPACE_AUTH`` (a pair, or the first of a list)."""
    pair = auth[0] if isinstance(auth, list) and auth else auth
    if not isinstance(pair, tuple) or len(pair) != 2:
        return None
    user, password = (urllib.parse.quote(str(part), safe="") for part in pair)
    return f"demo={user}:{password}"


def launch(self: gr.Blocks, *args: Any, **kwargs: Any) -> Any:
    app, local_url, share_url = _launch(self, *args, **kwargs)
    _stop(self)
    login = _login(kwargs.get("auth"))
    folder = Path(tempfile.mkdtemp(dir=_folder))  # its own coordinator and log
    env = service_env(f"demo={local_url}", folder, POOL_MIN_CONNECTIONS="1",
                      **({"POOL_SPACE_AUTH": login} if login else {}))  # fmt: skip
    service = _services[id(self)] = ServiceProcess(env, folder / "service.log")
    return app, f"{service.url}/gradio/demo/", share_url


def close(self: gr.Blocks, *args: Any, **kwargs: Any) -> Any:
    try:
        return _close(self, *args, **kwargs)
    finally:
        _stop(self)


def _stop(blocks: gr.Blocks) -> None:
    service = _services.pop(id(blocks), None)
    if service is not None:
        service.stop()


def pytest_configure(config: pytest.Config) -> None:
    gr.Blocks.launch = launch  # type: ignore[method-assign]
    gr.Blocks.close = close  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    for service in list(_services.values()):
        service.stop()
    _services.clear()
