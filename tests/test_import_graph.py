"""The package's import graph: no circle anywhere in ``pipeline/``, and the runtime's layers import
one way (triton -> serving -> spec_decode -> model).

Every import counts, also one inside a function or under ``TYPE_CHECKING``: a lazy import that
closes a circle still makes two modules one concept that cannot be read apart.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"
RUNTIME_LAYERS = ("model", "spec_decode", "serving", "triton")  # each may import only those before it


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from package import submodule`` depends on the submodule, not on the package's
                # __init__ (which Python imports first for any submodule anyway).
                submodules = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = [t for t in submodules if t in modules] or [node.module]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycles_finds_a_circle_and_ignores_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_package():
    assert cycles(import_graph()) == []


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] == ["pipeline", "runtime"] and len(parts) > 2 and parts[2] in RUNTIME_LAYERS:
        return parts[2]
    return None


@pytest.mark.parametrize("layer", RUNTIME_LAYERS)
def test_runtime_layers_import_downwards_only(layer):
    allowed = set(RUNTIME_LAYERS[: RUNTIME_LAYERS.index(layer) + 1])
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        if _layer(module) == layer
        for target in targets
        if _layer(target) not in allowed | {None}
    )
    assert wrong == []


def test_the_runtime_vocabulary_imports_no_layer():
    graph = import_graph()
    for module in ("pipeline.runtime.request", "pipeline.runtime.sampling"):
        assert [t for t in graph[module] if _layer(t)] == []
