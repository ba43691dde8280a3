"""The package's floors: which part of ``pipeline/`` may import which, and the page that shows it.

:data:`FLOORS` lists the parts from the bottom up; a module may import a module on its own floor or
below, never above (``tests/test_import_graph.py`` holds every import to it, lazy and
``TYPE_CHECKING`` ones included). A part is a package, a subpackage or a module
(``plan.types``); a module belongs to the longest part that names it. The page
``docs/reference/layers.md`` is generated from this table and the import graph; the picture
``docs/img/layers.png`` is drawn from the same by ``scripts/layers_figure.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from pipeline.docs_gen.markdown import GENERATED_NOTE

PACKAGE = Path(__file__).resolve().parents[1]

# (floor name, parts), bottom first.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("shared leaves", ("pipeline", "errors", "io", "geometry", "trees", "console", "progress")),
    ("the spec", ("spec",)),
    ("methods and targets", ("methods", "targets")),
    ("LoRA records and rules", ("lora.rules", "lora.memory", "lora.types", "fleet.lora_decision", "fleet.assign")),
    (
        "the plan's records",
        (
            "plan",
            "plan.types",
            "plan.speculative",
            "plan.memory",
            "plan.resources",
            "plan.adapters",
            "plan.head_training",
            "fleet.placement",
        ),
    ),
    ("the reference runtime", ("runtime",)),
    ("serving contracts", ("client", "triton", "trtllm", "llm_api")),
    ("the cost model", ("costmodel",)),
    ("checkpoints and quantization", ("checkpoint", "quantize", "embedded")),
    ("heads and fine-tunes", ("heads", "finetune")),
    ("LoRA decisions and rehearsal", ("lora", "evaluation")),
    ("planning", ("plan.planner",)),
    (
        "stages and validation",
        ("stages", "evaluation.stage", "plan.preflight", "llm_api.standin_runtime", "llm_api.standin_server"),
    ),
    ("Ray", ("fleet",)),
    ("release", ("release", "doctor")),
    ("entry points", ("commands", "docs_gen", "cli", "__main__")),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Every module of ``pipeline/`` and the modules of ``pipeline/`` it imports (any import counts)."""
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


def part_of(module: str) -> tuple[int, str] | None:
    """(floor index, part) of ``module``: the longest part naming it; None when no floor does."""
    name = module.removeprefix("pipeline.") if module != "pipeline" else "pipeline"
    found: tuple[int, str] | None = None
    for index, (_, parts) in enumerate(FLOORS):
        for part in parts:
            if (name == part or name.startswith(part + ".")) and (found is None or len(part) > len(found[1])):
                found = (index, part)
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import from a lower floor to a higher one."""
    out = []
    for module, targets in graph.items():
        here = part_of(module)
        for target in targets:
            there = part_of(target)
            if here is not None and there is not None and there[0] > here[0]:
                out.append(f"{module} -> {target}")
    return sorted(out)


def render() -> str:
    """docs/reference/layers.md: the floors, top first, with their parts and module counts."""
    graph = import_graph()
    counts: dict[str, int] = {}
    for module in graph:
        found = part_of(module)
        if found is not None:
            counts[found[1]] = counts.get(found[1], 0) + 1
    lines = [
        GENERATED_NOTE.format(source="`FLOORS` in `pipeline/docs_gen/layers.py` and the import graph"),
        "",
        "# Layers",
        "",
        "`pipeline/` is built in floors: a module imports its own floor and the floors below it, never one",
        "above (`tests/test_import_graph.py` checks every import, lazy and `TYPE_CHECKING` ones too). A new",
        "method is a module of `methods/` (and its runtime class in `runtime/spec_decode/`), a new target",
        "a module of `targets/`; both sit low, so every layer above can ask them.",
        "",
        "![The floors of pipeline/, top to bottom](../img/layers.png)",
        "",
        "| floor | parts (modules) |",
        "|---|---|",
    ]
    for name, parts in reversed(FLOORS):
        shown = ", ".join(f"`{part}` ({counts.get(part, 0)})" for part in parts)
        lines.append(f"| {name} | {shown} |")
    lines += [
        "",
        f"{len(graph)} modules on {len(FLOORS)} floors; imports running up: {len(upward_imports(graph))}.",
        "",
    ]
    return "\n".join(lines)
