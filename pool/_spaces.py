"""Parse ``POOL_SPACES`` entries into named Space specs (SPEC section 5: pool keys)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_ALIAS = re.compile(r"^[A-Za-z0-9][\w.-]{0,63}$")


@dataclass(frozen=True)
class SpaceSpec:
    """One backend: ``name`` keys the stats, ``src`` is what ``Client`` opens; ``app``
    names its group of replicas when the configuration says (``alias@app=URL``)."""

    name: str
    src: str
    app: str | None = None

    @property
    def is_hub(self) -> bool:
        """A Hub Space id (``owner/name``) or a ``*.hf.space`` URL."""
        if not self.src.startswith(("http://", "https://")):
            return True
        return (urlsplit(self.src).hostname or "").endswith(".hf.space")


def parse_space(entry: str) -> SpaceSpec:
    """``alias=URL`` | ``alias@app=URL`` | ``owner/name`` | ``URL`` → :class:`SpaceSpec`;
    ValueError if none."""
    entry = entry.strip()
    alias, sep, rest = entry.partition("=")
    if sep:
        alias, _, app = alias.strip().partition("@")
        src = rest.strip()
        if not _ALIAS.match(alias):
            raise ValueError(f"invalid Space alias {alias!r}")
        if app and not _ALIAS.match(app):
            raise ValueError(f"invalid app name {app!r} (alias@app=URL)")
        return SpaceSpec(alias, _check_src(src), app or None)
    src = _check_src(entry)
    if src.startswith(("http://", "https://")):
        parts = urlsplit(src)
        return SpaceSpec(parts.netloc, src)
    return SpaceSpec(src.split("/", 1)[1], src)


def _check_src(src: str) -> str:
    if src.startswith(("http://", "https://")):
        if not urlsplit(src).netloc:
            raise ValueError(f"invalid Space URL {src!r}")
        return src if src.endswith("/") else src + "/"
    if _HUB_ID.match(src):
        return src
    raise ValueError(f"invalid Space {src!r}: expected owner/name, a URL, or alias=URL")


def parse_spaces(entries: list[str]) -> list[SpaceSpec]:
    """Parse every entry; duplicate names are an error."""
    specs = [parse_space(e) for e in entries]
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate Space names: {', '.join(dupes)} (use alias=URL)")
    return specs
