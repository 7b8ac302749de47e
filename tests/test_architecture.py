"""docs/architecture.md's picture is scripts/architecture's, drawn from today's imports."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "architecture"


def _script() -> dict[str, Any]:
    return runpy.run_path(str(SCRIPT))


def test_the_documented_picture_is_the_scripts() -> None:
    script = _script()
    picture = script["draw"]()
    for unit in ("core", "edge", "gradio", "api", "transport", "ground"):
        assert f"  {unit} " in picture or picture.count(f"  {unit}\n"), unit
    assert script["documented"]() == picture, "run scripts/architecture, copy it into the doc"


def test_the_picture_reports_a_circle() -> None:
    floors = _script()["_floors"]
    try:
        floors({"a.x": {"b.y"}, "b.y": {"a.x"}}, {"a.x": "a", "b.y": "b"})
    except SystemExit as exc:
        assert str(exc) == "import circle: a -> b -> a"
    else:
        raise AssertionError("a circle was drawn")
