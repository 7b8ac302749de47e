"""The settings checked at start: one line per mistake, before anything is served.

:func:`check_environment` reads the ``POOL_*`` variables the way the pool and the
service will, and answers ``(problems, warnings)``:

* a problem is a value the service cannot start with (a malformed number, an unknown
  store scheme, a Space entry of no known form, ...): one line naming the setting, what
  is wrong and the valid forms — ``python -m app`` prints them and exits 2 before its
  banner; the lifespan (``uvicorn app.main:app``) logs them and does not start;
* a warning is a likely mistake the service runs with: a ``POOL_*`` variable no setting
  reads (with the closest known name), an admin token shorter than
  :data:`STRONG_TOKEN_CHARS` characters.

Secrets (tokens, ``POOL_SPACE_AUTH``, ``POOL_HF_TOKEN``, ``POOL_USER_HASH_KEY``, a URL's
password) are never quoted. :func:`coordinator_problem` asks the admission store once
(Redis only: memory and SQLite are in the process); :func:`probe_spaces` asks each
configured Space once and logs, by name, the ones that do not answer.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from pool import Pool, PoolSettings, parse_spaces, with_logins

from ._settings import ServiceSettings

STRONG_TOKEN_CHARS = 32
"""An admin token shorter than this is warned about (``secrets.token_urlsafe(24)`` is 32)."""
CHECKED = False
"""Set by ``python -m app`` once it checked (and printed) them: the lifespan does not repeat."""
_PROBE_S = 3.0
_SECRET = {"admin_token", "api_token", "hf_token", "space_auth", "user_hash_key"}
_STORE_FORMS = "memory://, sqlite:///path, redis://host:port/db or rediss://host:port/db"
_SPACE_FORMS = "owner/name, http(s)://host:port/, alias=URL or alias@app=URL, comma-separated"
_log = logging.getLogger("spacepool.app")


def known_names() -> frozenset[str]:
    """Every ``POOL_*`` variable a setting of the pool or the service reads."""
    fields = [*PoolSettings.model_fields, *ServiceSettings.model_fields]
    return frozenset(f"POOL_{name.upper()}" for name in fields)


def hide_password(url: str) -> str:
    """``url`` with the password of its user part (``//user:password@``) as ``***``,
    whether or not the rest of it parses."""
    return re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", url)


def check_environment(environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """``(problems, warnings)`` of the ``POOL_*`` variables in ``environ`` (module docs)."""
    env = {k: v for k, v in environ.items() if k.startswith("POOL_") or k == "HF_TOKEN"}
    problems: list[str] = []
    warnings = _unknown_names(env)
    pool_settings = _validated(PoolSettings, env, problems)
    service_settings = _validated(ServiceSettings, env, problems)
    if pool_settings is not None:
        problems += _store_problems(pool_settings.coordinator_url)
        try:
            specs = parse_spaces(pool_settings.space_entries())
        except ValueError as exc:
            problems.append(f"POOL_SPACES: {_hidden(str(exc))}; valid forms: {_SPACE_FORMS}")
        else:
            try:
                with_logins(specs, pool_settings.space_logins())
            except ValueError as exc:  # its message names positions and Spaces, not secrets
                problems.append(f"{exc}; valid form: name=username:password, comma-separated")
    admin = service_settings.admin_token if service_settings is not None else None
    if admin is not None and len(admin.get_secret_value()) < STRONG_TOKEN_CHARS:
        warnings.append(
            f"POOL_ADMIN_TOKEN is shorter than {STRONG_TOKEN_CHARS} characters: anyone who"
            " guesses it administers the service (make one: python3 -c 'import secrets;"
            " print(secrets.token_urlsafe(32))')"
        )
    return problems, warnings


def _unknown_names(env: Mapping[str, str]) -> list[str]:
    known = known_names()
    lines = []
    for name in sorted(env):
        if not name.startswith("POOL_") or name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        lines.append(f"{name} is not a spacepool setting and is ignored{hint}")
    return lines


def _validated(
    model: type[PoolSettings] | type[ServiceSettings], env: Mapping[str, str], out: list[str]
) -> Any:
    """``model`` read from ``env`` (not the process's environment), or None with one line
    per invalid field in ``out``."""
    values: dict[str, Any] = {}
    for field in model.model_fields:
        name = f"POOL_{field.upper()}"
        if name in env:
            values[field] = env[name]
    if model is PoolSettings and "POOL_HF_TOKEN" not in env and "HF_TOKEN" in env:
        values["hf_token"] = env["HF_TOKEN"]
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            shown = "" if field in _SECRET else f"={str(error.get('input', ''))!r}"
            message = str(error["msg"]).replace("Value error, ", "")
            # A rule across fields (min over max) names its settings in its message.
            out.append(f"POOL_{field.upper()}{shown}: {message}" if field else message)
        return None


def _store_problems(url: str) -> list[str]:
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    shown = hide_password(url)
    if scheme not in {"memory", "sqlite", "redis", "rediss"}:
        what = f"unsupported scheme {scheme!r}" if scheme else "no scheme"
        return [f"POOL_COORDINATOR_URL={shown!r}: {what}; valid forms: {_STORE_FORMS}"]
    parts = urlsplit(url)
    if scheme == "sqlite" and (parts.netloc or not parts.path.strip("/")):
        return [f"POOL_COORDINATOR_URL={shown!r}: a SQLite store is sqlite:///path"
                f" (three slashes, then the file's path); valid forms: {_STORE_FORMS}"]  # fmt: skip
    if scheme in {"redis", "rediss"}:
        try:
            parts.port  # noqa: B018  (raises on a port that is not a number)
        except ValueError:
            return [f"POOL_COORDINATOR_URL={shown!r}: the port is not a number;"
                    f" valid forms: {_STORE_FORMS}"]  # fmt: skip
        if not parts.hostname:
            return [f"POOL_COORDINATOR_URL={shown!r}: no host; valid forms: {_STORE_FORMS}"]
    return []


def _hidden(text: str) -> str:
    """A message that may quote a URL, with any password in it replaced."""
    return " ".join(hide_password(word) if "@" in word else word for word in text.split(" "))


async def coordinator_problem(url: str) -> str | None:
    """One line naming ``POOL_COORDINATOR_URL`` when its Redis does not answer within
    :data:`_PROBE_S`; None when it does (or the store is in the process)."""
    if not url.lower().startswith(("redis://", "rediss://")):
        return None
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url, socket_connect_timeout=_PROBE_S, socket_timeout=_PROBE_S)
    try:
        async with asyncio.timeout(_PROBE_S * 2):
            await client.ping()
    except Exception as exc:
        return (
            f"POOL_COORDINATOR_URL={hide_password(url)!r}: the admission store does not"
            f" answer ({type(exc).__name__}); without it nothing is admitted: start it or"
            " point POOL_COORDINATOR_URL at one that runs (docs/leases.md)"
        )
    finally:
        await client.aclose()
    return None


async def probe_spaces(pool: Pool) -> dict[str, str]:
    """Ask each configured Space with a URL once (Gradio's cheap ``gradio_api/app_id``
    route; any answer below 500 is an answer); log each that does not answer, by name
    (never its URL: it may carry a secret). Answers {name: why} of those."""
    down: dict[str, str] = {}
    async with httpx.AsyncClient(timeout=_PROBE_S, follow_redirects=False) as http:

        async def probe(name: str, url: str) -> None:
            try:
                answer = await http.get(url)
            except httpx.HTTPError as exc:
                down[name] = type(exc).__name__
                return
            if answer.status_code >= 500:
                down[name] = f"HTTP {answer.status_code}"

        await asyncio.gather(*(
            probe(name, sp.spec.src + "gradio_api/app_id") for name, sp in pool.spaces.items()
            if sp.spec.src.startswith(("http://", "https://"))
        ))  # fmt: skip
    for name, why in sorted(down.items()):
        _log.warning("Space %s does not answer at start (%s): calls go to the other Spaces"
                     " until it does; GET /readyz shows it down", name, why)  # fmt: skip
    return down
