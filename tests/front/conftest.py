"""Fixtures of the Gradio front: stand-in Spaces of this package and services over them.

``front_fleet``: "victim" (echo kind, killed by a test, so not the shared fleet),
"shapes" and "media" (image kind). Two services: ``pool_service`` over alpha, beta
(the shared fleet) and victim — replicas of one app, for ``/gradio/`` — with a global
cap of 4; ``alias_service`` over shapes and media, for ``/gradio/{alias}/``, with an API token.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devspaces import SpaceFleet
from tests.service.conftest import ServiceProcess, service_env

GLOBAL_CAP = 4
API_TOKEN = "front-api-token-3c9d"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


@pytest.fixture(scope="module")
def front_fleet() -> Iterator[SpaceFleet]:
    """victim (echo), shapes, media (image): this module's own stand-in Spaces."""
    names, kinds = ["victim", "shapes", "media"], ["echo", "shapes", "image"]
    with SpaceFleet(names=names, kind=kinds, startup_timeout_s=150) as f:
        yield f


def _start(spaces: str, folder: Path, **env: str) -> ServiceProcess:
    return ServiceProcess(service_env(spaces, folder, **env), folder / "service.log")


@pytest.fixture(scope="module")
def pool_service(
    fleet: SpaceFleet, front_fleet: SpaceFleet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """alpha, beta, victim (all echo: replicas of one app) with a global cap of 4."""
    spaces = f"{fleet.pool_spaces_env()},victim={front_fleet['victim'].url}"
    service = _start(spaces, tmp_path_factory.mktemp("front-pool"),
                     POOL_GLOBAL_MAX_CONCURRENT=str(GLOBAL_CAP))  # fmt: skip
    yield service
    service.stop()


@pytest.fixture(scope="module")
def alias_service(
    front_fleet: SpaceFleet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """shapes and media (two different apps), behind POOL_API_TOKEN."""
    spaces = ",".join(f"{s.name}={s.url}" for s in front_fleet if s.name != "victim")
    service = _start(spaces, tmp_path_factory.mktemp("front-alias"), POOL_API_TOKEN=API_TOKEN)
    yield service
    service.stop()
