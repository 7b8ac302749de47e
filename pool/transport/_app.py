"""What a Space's ``/config`` and ``/gradio_api/info`` say, read once per app_id.

The data layer stays gradio_client's: argument binding is ``utils.construct_args``,
file detection ``utils.is_file_obj_with_meta``, diffs ``utils.apply_diff``, and the
rules below mirror ``gradio_client/client.py`` ``Endpoint`` (state inputs get ``None``,
outputs of ``SKIP_COMPONENTS`` are dropped, a single output is returned bare) and
``Client._get_api_info`` (private endpoints hidden from ``view_api``).
"""

from __future__ import annotations

import copy
import dataclasses
import urllib.parse
from dataclasses import dataclass
from typing import Any

from gradio_client import utils

# Protocols whose queue is join + one data stream per session (gradio_client
# client.py ``Endpoint.make_predict``; gradio/routes.py ``queue_join``/``queue_data``).
NATIVE_PROTOCOLS = frozenset({"sse_v1", "sse_v2", "sse_v2.1", "sse_v3"})
# Protocols whose process_generating messages carry diffs after the first
# (gradio_client utils.py ``stream_sse_v1plus``).
DIFF_PROTOCOLS = frozenset({"sse_v2", "sse_v2.1", "sse_v3"})


class ProtocolNotSupported(Exception):
    """The Space speaks a protocol this transport does not (``ws``, ``sse``, …)."""


@dataclass(frozen=True)
class Endpoint:
    """One dependency of the app, as a caller sees it."""

    fn_index: int
    api_name: str | None
    public: bool
    generator: bool
    inputs: tuple[int, ...]  # component ids
    state_inputs: tuple[int, ...]  # positions that take no caller value
    kept_outputs: tuple[int, ...]  # positions returned to the caller
    parameters: list[dict[str, Any]] | None
    needs_heartbeat: bool = False  # a session calling it holds the heartbeat stream


class AppInfo:
    """A Space's config and API for one ``app_id``: endpoints, URLs, protocol."""

    def __init__(self, src: str, config: dict[str, Any], info: dict[str, Any]) -> None:
        self.src = src if src.endswith("/") else src + "/"
        self.config = config
        self.protocol = str(config.get("protocol", "ws"))
        if self.protocol not in NATIVE_PROTOCOLS:
            raise ProtocolNotSupported(f"protocol {self.protocol!r}")
        self.app_id: object = config.get("app_id")
        prefix = str(config.get("api_prefix", "")).lstrip("/") + "/"
        self.prefixed = urllib.parse.urljoin(self.src, prefix).rstrip("/") + "/"
        self.heartbeat = bool(config.get("connect_heartbeat", False))
        max_size = config.get("max_file_size")
        self.max_file_size = max_size if isinstance(max_size, int) else None
        self._raw_info = info
        self.info = _visible_info(info)
        components = {c["id"]: c for c in config.get("components", []) if "id" in c}
        deps = config.get("dependencies", [])
        every_session = self.heartbeat and _heartbeat_for_all(deps, components)
        self.endpoints: dict[int, Endpoint] = {}
        self._by_name: dict[str, Endpoint] = {}
        for i, dep in enumerate(deps):
            endpoint = _endpoint(dep.get("id", i), dep, components, self.info)
            if self.heartbeat and (every_session or _heartbeat_for(dep, components)):
                endpoint = dataclasses.replace(endpoint, needs_heartbeat=True)
            self.endpoints[endpoint.fn_index] = endpoint
            if endpoint.api_name is not None and endpoint.public:
                self._by_name.setdefault(endpoint.api_name, endpoint)

    def url(self, path: str) -> str:
        """``path`` under the API prefix (``/gradio_api/``)."""
        return self.prefixed + path

    def api_names(self) -> list[str]:
        return list(self._by_name)

    def endpoint(self, api_name: str | None) -> Endpoint:
        """The endpoint named ``api_name`` (with its slash); without one, the only
        public endpoint. ValueError as gradio_client's ``_infer_fn_index``."""
        if api_name is not None:
            found = self._by_name.get(api_name)
            if found is None:
                raise ValueError(f"Cannot find a function with `api_name`: {api_name}.")
            return found
        named = [e for e in self.endpoints.values() if e.public and e.api_name is not None]
        if len(named) != 1:
            raise ValueError(
                "This Gradio app might have multiple endpoints. Please specify an `api_name`"
            )
        return named[0]

    def view_api(self) -> dict[str, Any]:
        """``Client.view_api(return_format="dict")``: a copy of the visible API info."""
        return copy.deepcopy(self.info)


def named_endpoints(config: dict[str, Any]) -> dict[str, Endpoint]:
    """The public endpoints a config names, by ``api_name`` (with its slash): the one
    reading of a config's dependencies, for a config of any protocol (the fallback's)."""
    components = {c["id"]: c for c in config.get("components", []) if "id" in c}
    named: dict[str, Endpoint] = {}
    for i, dep in enumerate(config.get("dependencies", [])):
        endpoint = _endpoint(dep.get("id", i), dep, components, {})
        if endpoint.api_name is not None and endpoint.public:
            named.setdefault(endpoint.api_name, endpoint)
    return named


def _visible_info(info: dict[str, Any]) -> dict[str, Any]:
    """gradio_client ``Client._get_api_info``: drop code snippets and private endpoints."""
    out: dict[str, Any] = {}
    for key in ("named_endpoints", "unnamed_endpoints"):
        kept = {}
        for name, endpoint in (info.get(key) or {}).items():
            endpoint = dict(endpoint)
            endpoint.pop("code_snippets", None)
            visibility = endpoint.pop("api_visibility", None)
            shown = endpoint.pop("show_api", True)
            if (visibility is not None and visibility != "private") or shown:
                kept[name] = endpoint
        out[key] = kept
    return out


def _endpoint(
    fn_index: int, dep: dict[str, Any], components: dict[int, dict[str, Any]],
    info: dict[str, Any],
) -> Endpoint:  # fmt: skip
    raw_name = dep.get("api_name")
    api_name = "/" + raw_name if isinstance(raw_name, str) and raw_name else None
    if "api_visibility" in dep:
        public = dep["api_visibility"] != "private"
    else:
        public = raw_name is not False
    inputs = tuple(dep.get("inputs", []))
    outputs = tuple(dep.get("outputs", []))

    def kind(cid: int) -> str:
        return str(components.get(cid, {}).get("type", ""))

    def skipped(cid: int) -> bool:
        component = components.get(cid, {})
        return bool(component.get("skip_api", kind(cid) in utils.SKIP_COMPONENTS))

    named = info.get("named_endpoints", {}).get(api_name) if api_name else None
    return Endpoint(
        fn_index=fn_index,
        api_name=api_name,
        public=public,
        # A config that does not say (Gradio 3) may stream: followed as a generator.
        generator=bool((dep.get("types") or {}).get("generator", True)),
        inputs=inputs,
        state_inputs=tuple(i for i, cid in enumerate(inputs) if kind(cid) == "state"),
        kept_outputs=tuple(i for i, cid in enumerate(outputs) if not skipped(cid)),
        parameters=named.get("parameters") if named else None,
    )


def _triggers(dep: dict[str, Any]) -> set[str]:
    targets = dep.get("targets", [])
    return {str(t[1]) for t in targets if isinstance(t, list | tuple) and len(t) == 2}


def _heartbeat_for_all(deps: list[dict[str, Any]], components: dict[int, dict[str, Any]]) -> bool:
    """Whether every session needs the heartbeat stream, not only those that call an
    endpoint with ``gr.State`` or a ``stream`` trigger (:func:`_heartbeat_for`).

    gradio/utils.py ``connect_heartbeat`` sets ``connect_heartbeat`` for an app with any
    ``gr.State``, an ``unload`` listener, a ``stream`` trigger or a per-session cache;
    gradio/routes.py ``heartbeat``, when the stream ends, runs the ``unload`` listeners,
    marks the session's state closed, clears its per-session caches and ends its media
    streams. ``unload`` listeners are per session whatever it called, and a per-session
    cache is not visible in the config (the flag without State, unload or stream says
    one is there): both need it for every session."""
    if any("unload" in _triggers(dep) for dep in deps):
        return True
    has_state = any(c.get("type") == "state" for c in components.values())
    has_stream = any("stream" in _triggers(dep) for dep in deps)
    return not (has_state or has_stream)


def _heartbeat_for(dep: dict[str, Any], components: dict[int, dict[str, Any]]) -> bool:
    """Whether a call of ``dep`` needs its session's heartbeat: it reads or writes a
    ``gr.State`` (kept per session, closed when the heartbeat ends) or is a ``stream``
    event (its media stream ends with the heartbeat)."""
    used = [*dep.get("inputs", []), *dep.get("outputs", [])]
    touches_state = any(components.get(cid, {}).get("type") == "state" for cid in used)
    return touches_state or "stream" in _triggers(dep)


def bind_args(endpoint: Endpoint, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The call's data list: keywords bound (``utils.construct_args``), state slots
    filled with None (``Endpoint.insert_empty_state``). ValueError/TypeError as
    gradio_client raises them."""
    data = list(utils.construct_args(endpoint.parameters, args, kwargs))
    for position in endpoint.state_inputs:
        data.insert(position, None)
    return data


def shape_output(endpoint: Endpoint, data: list[Any]) -> Any:
    """The caller's value of an output list (``remove_skipped_components`` then
    ``reduce_singleton_output``)."""
    kept = [data[i] for i in endpoint.kept_outputs if i < len(data)]
    return kept[0] if len(endpoint.kept_outputs) == 1 and kept else tuple(kept)


def apply_diff(value: Any, diff: list[Any]) -> Any:
    """A generator's output after one ``process_generating`` diff (sse_v2+;
    gradio_client ``utils.apply_diff``)."""
    return utils.apply_diff(value, diff)
