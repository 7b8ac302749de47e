"""Parse ``POOL_SPACES`` entries into named Space specs (SPEC section 5: pool keys), and
``POOL_SPACE_AUTH`` into the logins of Spaces behind Gradio's own ``auth``."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_ALIAS = re.compile(r"^[A-Za-z0-9][\w.-]{0,63}$")


@dataclass(frozen=True)
class Login:
    """A username and password for a Space's Gradio login (``demo.launch(auth=...)``);
    the password never appears in a ``repr``, a log or an error."""

    username: str
    password: str

    def __repr__(self) -> str:
        return f"Login(username={self.username!r}, password=<hidden>)"


@dataclass(frozen=True)
class SpaceSpec:
    """One backend: ``name`` keys the stats, ``src`` is what ``Client`` opens; ``app``
    names its group of replicas when the configuration says (``alias@app=URL``);
    ``login`` the credentials of a Space behind Gradio's login (``POOL_SPACE_AUTH``)."""

    name: str
    src: str
    app: str | None = None
    login: Login | None = dataclasses.field(default=None, repr=False, compare=False)

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


def parse_logins(text: str) -> dict[str, Login]:
    """``POOL_SPACE_AUTH``: comma-separated ``name=username:password`` (username and
    password percent-decoded, so that ``%2C``, ``%3A``, ``%25`` carry ``,``, ``:``,
    ``%``) → {Space name: Login}. ValueError naming the entry's position, never its text."""
    logins: dict[str, Login] = {}
    entries = [e.strip() for e in text.split(",") if e.strip()]
    for number, entry in enumerate(entries, 1):
        name, sep, pair = entry.partition("=")
        username, colon, password = pair.partition(":")
        name = name.strip()
        if not sep or not colon or not _ALIAS.match(name) or not username:
            raise ValueError(f"POOL_SPACE_AUTH entry {number}: expected name=username:password")
        if name in logins:
            raise ValueError(f"POOL_SPACE_AUTH names Space {name!r} twice")
        logins[name] = Login(unquote(username), unquote(password))
    return logins


def with_logins(specs: list[SpaceSpec], logins: dict[str, Login]) -> list[SpaceSpec]:
    """``specs`` with their logins; ValueError for a login of no configured Space."""
    unknown = sorted(set(logins) - {s.name for s in specs})
    if unknown:
        raise ValueError(f"POOL_SPACE_AUTH names no configured Space: {', '.join(unknown)}")
    return [dataclasses.replace(s, login=logins[s.name]) if s.name in logins and s.login is None
            else s for s in specs]  # fmt: skip
