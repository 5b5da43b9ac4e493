"""pylock's architecture as its imports show it: no cycle between modules,
each subpackage importing only the layers below it, one importer of the
compiled module, and no reach into another subpackage's private names."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from tests.support import CHECKOUT, REPO_ROOT

pytestmark = [
    pytest.mark.portable,
    pytest.mark.skipif(not CHECKOUT, reason="reads the source tree"),
]

PACKAGE = Path(REPO_ROOT) / "pylock"

# Each folder, and what it may import (besides itself and the standard library).
LAYERS: dict[str, set[str]] = {
    "_core": set(),
    "_lock": {"_core"},
    "_exit": {"_core", "_lock"},
    "etcd": {"_core", "_lock"},
    "_daemon": {"_core", "_lock", "_exit"},
    "metrics": {"_core", "_lock"},
    "filelock": {"_core", "_lock", "_exit"},  # filelock's API on pylock.Lock
    "_cli": {"_core", "_lock", "_exit", "_daemon", "etcd"},
    "": {"_core", "_lock", "_exit", "_daemon", "metrics"},  # pylock/__init__.py
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(["pylock", *parts])] = path
    return found


def _imports(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) for every import of a pylock module, at any depth: a
    function's import and a typing-only one are dependencies too."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "pylock":
                continue
            names = [a.name for a in node.names]
            # from . import x: x may be a module
            submodules = [f"{module}.{n}" for n in names if f"{module}.{n}" in _MODULES]
            if submodules:
                out.extend((m, []) for m in submodules)
            else:
                out.append((module, names))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names if a.name.split(".")[0] == "pylock")
    return out


_MODULES = _modules()


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in _MODULES.items():
        edges = set()
        for module, _ in _imports(name, path):
            while module not in _MODULES and "." in module:
                module = module.rpartition(".")[0]
            if module != name and module != "pylock":
                edges.add(module)
        graph[name] = edges
    return graph


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_module_imports_itself_back_through_others() -> None:
    graph = _graph()
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_each_folder_imports_only_the_layers_below_it() -> None:
    wrong = []
    for module, edges in _graph().items():
        folder = _folder(module)
        if folder in ("_native", "__main__"):
            continue
        allowed = LAYERS[folder] | {folder}
        wrong += [f"{module} -> {e}" for e in edges if _folder(e) not in allowed | {"_native"}]
    assert not wrong, "imports against the layering: " + ", ".join(sorted(wrong))


def test_only_core_native_imports_the_compiled_module() -> None:
    importers = sorted(
        name
        for name, path in _MODULES.items()
        if any(m == "pylock._native" for m, _ in _imports(name, path))
        or "_native" in path.read_text(encoding="utf-8")
    )
    assert importers == ["pylock._core.native"]


def test_no_module_imports_a_private_name_of_another_folder() -> None:
    wrong = []
    for name, path in _MODULES.items():
        for module, names in _imports(name, path):
            if _folder(module) == _folder(name) or module == "pylock._native":
                continue
            wrong += [
                f"{name}: {module}.{n}"
                for n in names
                if n.startswith("_") and not n.startswith("__")
            ]
    assert not wrong, ", ".join(wrong)


def test_no_class_attribute_of_lock_is_assigned_outside_its_class() -> None:
    wrong = []
    for name, path in _MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and ast.unparse(target.value) in (
                    "Lock",
                    "_lock.Lock",
                ):
                    wrong.append(f"{name}: {ast.unparse(target)}")
    assert not wrong, ", ".join(wrong)


@pytest.mark.parametrize("limit", [420])
def test_no_module_is_over_the_size_a_reader_takes_in(limit: int) -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > limit
    }
    assert not long, long


def test_no_function_is_over_fifty_lines_of_code() -> None:
    long = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body
                if (
                    body
                    and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                ):
                    body = body[1:]  # the docstring
                if not body:
                    continue
                lines = body[-1].end_lineno - body[0].lineno + 1  # type: ignore[operator]
                if lines > 50:
                    long.append(
                        f"{os.path.relpath(path, PACKAGE)}:{node.lineno} {node.name} {lines}"
                    )
    assert not long, ", ".join(long)
