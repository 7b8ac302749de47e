"""The package's shape: layers that import only downward, no import circle, one
connection interface that nothing above the transport looks behind; and the service's:
app/ in folders by face, no circle between them, each reached through its face, no module
or class too long.

The layers of ``pool/``, top-down (README, "How it is built"): each module imports only
modules of its own layer or of a layer below it, counting every import — at load time,
under ``TYPE_CHECKING`` and inside functions — and no two modules import each other
round a circle.

Faces: a layer folder's package (``pool/connections/__init__.py``, …) is the layer's
face. A module of another layer imports the face, never a private module behind it (the
ground's modules, one flat row with no package, are their own face); ``app/`` imports
only ``pool`` itself and the layer faces.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POOL = ROOT / "pool"

GROUND = {"_settings", "_clock", "_exceptions", "_events", "_tasks", "_threads", "_spaces",
          "_failures", "_retry", "_consumer", "_trace"}  # fmt: skip
LAYERS = ["top", "routing", "connections", "resilience", "admission", "transport", "ground"]
"""Top-down: ``top`` is ``Pool`` and the request path (pool/*.py but the ground modules)."""
FOLDERS = ["routing", "connections", "resilience", "admission", "transport"]
"""The layers that are a folder (a package) of pool/."""
# Transport classes only the transport layer (and the composition root, which picks one)
# may name: everything above holds a SpaceClient / SpaceCall / SpaceOpener.
# (The wire's own types — Session, Call, SpaceTransport — are what SpaceClient.wire()
# hands a relay of the raw protocol: the Gradio front.)
IMPLEMENTATIONS = {"NativeClient", "FallbackClient", "GradioJob", "NativeOpener",
                   "FallbackOpener", "GradioFactory"}  # fmt: skip
COMPOSITION_ROOT = {"pool._pool": {"NativeOpener", "FallbackOpener", "GradioFactory"}}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FACES = {"pool", *(f"pool.{layer}" for layer in FOLDERS)}
"""What may be imported across a layer boundary besides the ground's modules, and all
``app/`` may import of the pool."""


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in FOLDERS:
        return parts[1]
    return "ground" if len(parts) == 2 and parts[1] in GROUND else "top"


def _imports(path: Path, name: str) -> set[str]:
    """Every module ``path`` imports, anywhere in the file (absolute names)."""
    return _imports_of(ast.parse(path.read_text()), name, path.name == "__init__.py")


def _imports_of(tree: ast.AST, name: str, is_package: bool = False) -> set[str]:
    """Every module that module ``name`` (parsed as ``tree``) imports, and every name it
    imports from one (``pool.get_pool``): absolute."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for child in ast.walk(tree):
        if isinstance(child, ast.ImportFrom):
            if child.level:
                base = package.split(".")
                base = base[: len(base) - (child.level - 1)]
                target = ".".join([*base, child.module] if child.module else base)
            else:
                target = child.module or ""
            if child.module:  # "from . import _files" loads pool._files, not pool
                found.add(target)
            found.update(f"{target}.{alias.name}" for alias in child.names)
        elif isinstance(child, ast.Import):
            found.update(alias.name for alias in child.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in POOL.rglob("*.py")}
    return {
        name: {m for m in _imports(path, name) if m in modules and m != name}
        for name, path in modules.items()
    }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among modules, or None. A package's ``__init__`` re-exporting
    its own modules is not one when they never import their package back."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a layer to a layer above it."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    return sorted(
        f"{a} ({layer_of(a)}) -> {b} ({layer_of(b)})"
        for a, targets in graph.items()
        for b in targets
        if rank[layer_of(b)] < rank[layer_of(a)]
    )


def _private_reach(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a private module of another layer's folder (not its face)."""
    return sorted(
        f"{a} ({layer_of(a)}) -> {b} ({layer_of(b)})"
        for a, targets in graph.items()
        for b in targets
        if layer_of(b) in FOLDERS and layer_of(b) != layer_of(a) and b not in FACES
    )


def _app_reach(imports: set[str], modules: set[str]) -> list[str]:
    """The pool's modules in ``imports`` (of a module of app/) that are not a face."""
    return sorted(m for m in imports if m in modules and m not in FACES)


def _sources() -> list[Path]:
    return sorted([*POOL.rglob("*.py"), *(ROOT / "app").rglob("*.py")])


def test_no_module_of_pool_imports_a_layer_above_its_own() -> None:
    graph = _graph()
    assert {layer_of(m) for m in graph} == set(LAYERS), "every layer has modules"
    assert _upward(graph) == []


def test_pool_modules_import_no_cycle_counting_type_checking_imports() -> None:
    graph = _graph()
    assert graph["pool._pool"], "the import graph was read"
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_a_layer_imports_another_layer_only_through_its_face() -> None:
    """Across layers a module imports a folder layer's package (its face), never a
    private module behind it; inside its own layer it imports what it needs."""
    graph = _graph()
    assert set(graph) >= FACES, "every layer folder has a face"
    assert any(f"pool.{layer}" in graph["pool._attempt"] for layer in FOLDERS), "faces are read"
    assert _private_reach(graph) == []


def test_app_imports_the_pool_only_through_its_faces() -> None:
    """app/ imports ``pool`` and the layer faces (``pool.admission``, …), no private
    module of the pool, wherever the import is."""
    modules = set(_graph())
    found = {
        str(p.relative_to(ROOT)): reach
        for p in sorted((ROOT / "app").rglob("*.py"))
        if (reach := _app_reach(_imports(p, _module_name(p)), modules))
    }
    assert any("pool" in _imports(p, _module_name(p)) for p in (ROOT / "app").rglob("*.py"))
    assert found == {}


def test_the_checks_can_fail() -> None:
    """A planted circle, upward import, private reach across layers and private
    import from app/ are each reported."""
    assert _cycle({"a": {"b"}, "b": {"a"}, "c": set()}) == ["a", "b", "a"]
    planted = {"pool.transport._native": {"pool.connections._handle"}}
    assert _upward(planted) == [
        "pool.transport._native (transport) -> pool.connections._handle (connections)"
    ]
    reach = {
        "pool._attempt": {"pool.routing._choice", "pool.routing", "pool._clock"},
        "pool.routing._choice": {"pool.routing._apps", "pool.connections", "pool._consumer"},
        "pool.connections._handle": {"pool.transport._errors"},
    }
    assert _private_reach(reach) == [
        "pool._attempt (top) -> pool.routing._choice (routing)",
        "pool.connections._handle (connections) -> pool.transport._errors (transport)",
    ]
    app = ast.parse(
        "from pool import get_pool, Pool\nfrom pool._consumer import CURRENT\n"
        "from pool.admission import SharedValues, _watch\n"
        "def f():\n    import pool.connections._downloads\n"
    )
    modules = set(_graph())
    assert _app_reach(_imports_of(app, "app._x"), modules) == [
        "pool._consumer", "pool.admission._watch", "pool.connections._downloads"
    ]  # fmt: skip
    tree = ast.parse("isinstance(x, NativeClient)\nfrom gradio_client import Client\n")
    assert _forbidden_names(tree, "pool._request") == ["NativeClient"]
    assert _gradio_client_imports(tree) == ["gradio_client"]


def _gradio_client_imports(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level:
            found += [node.module or ""] if (node.module or "").startswith("gradio_client") else []
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("gradio_client")]
    return found


def _forbidden_names(tree: ast.AST, module: str) -> list[str]:
    """Transport implementation classes named (imported, tested, used) in ``module``."""
    allowed = COMPOSITION_ROOT.get(module, set())
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.alias):
            name = node.asname or node.name.rpartition(".")[2]
        if name in IMPLEMENTATIONS and name not in allowed:
            found.append(name)
    return found


def test_gradio_client_is_imported_only_by_the_transport() -> None:
    outside = {
        str(p.relative_to(ROOT)): names
        for p in _sources()
        if "pool/transport/" not in p.as_posix()
        and (names := _gradio_client_imports(ast.parse(p.read_text())))
    }
    assert outside == {}


def test_nothing_above_the_transport_names_a_transport_implementation() -> None:
    """Above ``pool/transport`` a connection is a SpaceClient: no isinstance test, no
    attribute, no import of a transport's own class (the pool picks its opener once)."""
    outside = {
        str(p.relative_to(ROOT)): names
        for p in _sources()
        if "pool/transport/" not in p.as_posix()
        and (names := _forbidden_names(ast.parse(p.read_text()), _module_name(p)))
    }
    assert outside == {}


def test_no_function_in_the_pool_module_is_over_60_lines() -> None:
    """pool/_pool.py keeps each function at 60 lines or fewer."""
    tree = ast.parse((POOL / "_pool.py").read_text())
    long = {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno
        if node.end_lineno - node.lineno + 1 > 60
    }
    assert long == {}


# -- app/: folders by face ------------------------------------------------------------------
APP = ROOT / "app"
APP_FOLDERS = {"core", "teams", "edge", "calls", "jobs", "api", "admin", "gradio"}
"""app/ by face (docs/architecture.md): every module of app/ is in one of these folders but
the entry points, and a folder's ``__init__`` is the face the other folders import."""
APP_ENTRY_POINTS = {"app", "app.main", "app.__main__", "app._http"}
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 250
# Modules allowed over the bounds (none: the Gradio front's sessions are split now).
SIZE_ALLOWANCES: set[str] = set()


def _app_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in APP.rglob("*.py")}
    return {
        name: {m for m in _imports(path, name) if m in modules and m != name}
        for name, path in modules.items()
    }


def _folder(module: str) -> str | None:
    """The app folder ``module`` belongs to (None: an entry point)."""
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in APP_FOLDERS else None


def _folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Folder -> the folders its modules import (the entry points left out)."""
    folders: dict[str, set[str]] = {}
    for a, targets in graph.items():
        if (fa := _folder(a)) is None:
            continue
        folders.setdefault(fa, set())
        folders[fa] |= {fb for b in targets if (fb := _folder(b)) not in (None, fa)}
    return folders


def _past_the_face(graph: dict[str, set[str]]) -> list[str]:
    """Imports of another folder's private module (not its face ``app.<folder>``)."""
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if (fb := _folder(b)) is not None and fb != _folder(a) and b != f"app.{fb}"
    )


def _oversized(path: str, text: str) -> list[str]:
    """The module, and each class, longer than the bounds."""
    found = []
    if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
        found.append(f"{path}: {lines} lines")
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.ClassDef):
            continue
        if (length := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_CLASS_LINES:
            found.append(f"{path}: class {node.name} {length} lines")
    return found


def test_app_modules_live_in_folders_by_face() -> None:
    graph = _app_graph()
    loose = sorted(m for m in graph if _folder(m) is None and m not in APP_ENTRY_POINTS)
    assert loose == [], "a module of app/ outside its folders"
    assert {f for m in graph if (f := _folder(m))} == APP_FOLDERS, "every folder has modules"
    faces = {f"app.{f}" for f in APP_FOLDERS}
    assert faces <= set(graph), "every folder has its face (__init__.py)"


def test_app_folders_import_no_circle_and_only_through_faces() -> None:
    graph = _app_graph()
    folders = _folder_graph(graph)
    assert folders["api"], "the import graph was read"
    assert _cycle(folders) is None, f"import circle: {' -> '.join(_cycle(folders) or [])}"
    assert _past_the_face(graph) == []


def test_no_app_module_or_class_is_too_long() -> None:
    found = [
        line
        for p in sorted(APP.rglob("*.py"))
        if (rel := p.relative_to(ROOT).as_posix()) not in SIZE_ALLOWANCES
        for line in _oversized(rel, p.read_text())
    ]
    assert found == []


def test_the_app_checks_can_fail() -> None:
    """A planted circle between folders, a reach past a face and an oversized class and
    module are reported."""
    planted = {
        "app.api._jobs": {"app.jobs._runner", "app.jobs"},
        "app.jobs._runner": {"app.api"},
        "app.main": {"app.core._errors"},
    }
    assert _cycle(_folder_graph(planted)) == ["api", "jobs", "api"]
    assert _past_the_face(planted) == ["app.api._jobs -> app.jobs._runner",
                                       "app.main -> app.core._errors"]  # fmt: skip
    big = "class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES + "y = 2\n" * MAX_MODULE_LINES
    assert _oversized("app/x.py", big) == [
        f"app/x.py: {MAX_CLASS_LINES + 1 + MAX_MODULE_LINES} lines",
        f"app/x.py: class Big {MAX_CLASS_LINES + 1} lines",
    ]
