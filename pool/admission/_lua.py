"""The Redis store's Lua scripts, kept as ``.lua`` files beside this module.

A script is Lua, not Python: in its own file it is read, diffed and linted as Lua, and
its line numbers in a Redis error match the file. The files ship as package data
(``pyproject.toml``: ``[tool.setuptools.package-data]``), so an installed package
has them; they are read once, when the store's module is imported.
"""

from __future__ import annotations

from importlib import resources


def load_script(name: str) -> str:
    """The text of ``pool/admission/<name>``."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
