"""The package's shape: no import cycle among pool/'s modules, short functions in _pool.py."""

from __future__ import annotations

import ast
from pathlib import Path

POOL = Path(__file__).resolve().parent.parent / "pool"


def _module_name(path: Path) -> str:
    parts = path.relative_to(POOL.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """The pool modules ``path`` imports at load time (not under TYPE_CHECKING)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in tree.body:  # module level only: imports inside functions run later
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for child in ast.walk(node):
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
    """One import cycle among private modules (a package's __init__ re-exporting its
    own modules is not one: they never import their package back), or None."""
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


def test_pool_modules_import_no_cycle() -> None:
    """No pool module imports (at load time) a module that imports it back."""
    graph = _graph()
    assert graph["pool._pool"], "the import graph was read"  # the parser sees imports
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_cycle_finder_finds_a_planted_cycle() -> None:
    """The check above can fail: a planted a -> b -> a is reported."""
    assert _cycle({"a": {"b"}, "b": {"a"}, "c": set()}) == ["a", "b", "a"]


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
