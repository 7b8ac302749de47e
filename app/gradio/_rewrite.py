"""The Space's address replaced by the service's in any JSON value (no Space URL leaks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Rewrite = Callable[[Any], Any]


def rewriter(space_root: str, front_root: str) -> Rewrite:
    """A function replacing ``space_root`` by ``front_root`` wherever it occurs in a
    string (a URL, or inside a text such as ``info``'s code snippets)."""
    src = space_root.rstrip("/")
    dst = front_root.rstrip("/")

    def rewrite(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(src, dst) if src in value else value
        if isinstance(value, list):
            return [rewrite(v) for v in value]
        if isinstance(value, dict):
            return {k: rewrite(v) for k, v in value.items()}
        return value

    return rewrite
