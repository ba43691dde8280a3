"""The package's import graph: no circle anywhere in ``pipeline/``, every import runs down the
floors of ``pipeline/docs_gen/layers.py``, and the runtime's layers import one way
(triton -> serving -> spec_decode -> model).

Every import counts, also one inside a function or under ``TYPE_CHECKING``: a lazy import that
closes a circle still makes two modules one concept that cannot be read apart.
"""

from __future__ import annotations

import pytest

from pipeline.docs_gen.layers import FLOORS, import_graph, part_of, upward_imports

RUNTIME_LAYERS = ("model", "spec_decode", "serving", "triton")  # each may import only those before it


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


def test_every_module_is_on_a_floor():
    assert [m for m in import_graph() if part_of(m) is None] == []


def test_every_import_runs_down_the_floors():
    assert upward_imports(import_graph()) == []


def test_every_part_names_something():
    used = {found[1] for found in map(part_of, import_graph()) if found is not None}
    assert [part for _, parts in FLOORS for part in parts if part not in used] == []


def test_upward_imports_finds_one_going_up():
    # methods sit below the plan's records: a method importing the plan would go up
    assert upward_imports({"pipeline.methods.x": {"pipeline.plan.types"}}) == [
        "pipeline.methods.x -> pipeline.plan.types"
    ]
    assert upward_imports({"pipeline.plan.types": {"pipeline.methods.x"}}) == []
