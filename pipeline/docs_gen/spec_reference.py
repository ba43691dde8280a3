"""The spec reference page, read off the JSON schema ``specdeploy schema`` prints.

Every field of a spec file by its dotted path (``serving.grpc_port``): type, default, the rules
the schema enforces (ranges, choices, patterns, required keys) and its description. The checks
a schema cannot express, which the loader makes across fields, come from the validators of
:mod:`pipeline.spec.document` (their error messages, as a user sees them), and the names a field accepts
(tree presets, architecture presets, GPU types, embedded models) from the tables that define them.
"""

from __future__ import annotations

import ast
import inspect
import json
from dataclasses import dataclass, field
from typing import Any

from pipeline import embedded, methods, trees
from pipeline.docs_gen.markdown import GENERATED_NOTE, code, rst_to_markdown, table
from pipeline.spec import document as spec
from pipeline.spec import gpus, presets
from pipeline.spec.json_schema import PARTIAL_PREFIX, spec_json_schema

ROOT = "(top level)"


@dataclass
class Section:
    """One object of the spec (the top level, or a nested mapping such as ``heads.medusa``)."""

    path: str
    definition: str | None  # the $defs name, None for the top level
    node: dict[str, Any]
    also_at: list[str] = field(default_factory=list)


def _definition(node: dict[str, Any]) -> str | None:
    """The $defs name an object-valued property refers to (directly or as ``X | null``)."""
    if "$ref" in node:
        return node["$ref"].rsplit("/", 1)[-1]
    for option in node.get("anyOf", ()):
        if "$ref" in option:
            return option["$ref"].rsplit("/", 1)[-1]
    return None


def sections(schema: dict[str, Any]) -> list[Section]:
    """The objects of a spec in reading order, each once; a definition used at several paths
    (``heads.medusa.train``, ``heads.eagle.train``) is listed at the first, naming the others."""
    defs = schema["$defs"]
    found: list[Section] = [Section(ROOT, None, schema)]
    by_definition: dict[str, Section] = {}

    def visit(prefix: str, node: dict[str, Any]) -> None:
        for key, body in node.get("properties", {}).items():
            name = _definition(body)
            if name is None or name.startswith(PARTIAL_PREFIX):
                continue
            path = f"{prefix}.{key}" if prefix else key
            if name in by_definition:
                by_definition[name].also_at.append(path)
                continue
            section = by_definition[name] = Section(path, name, defs[name])
            found.append(section)
            visit(path, defs[name])

    visit("", schema)
    return found


def type_of(node: dict[str, Any], anchors: dict[str, str]) -> str:
    """A schema node's type in words: ``integer``, ``string or null``, ``list of integer``, a link."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return f"mapping ([`{anchors[name]}`](#{anchors[name]}))" if name in anchors else "mapping"
    if "anyOf" in node:
        return " or ".join(type_of(option, anchors) for option in node["anyOf"])
    if "enum" in node:
        return "string"
    kind = node.get("type")
    if kind == "array":
        return f"list of {type_of(node['items'], anchors)}" if "items" in node else "list"
    if kind == "object":
        extra = node.get("additionalProperties")
        return f"mapping of string to {type_of(extra, anchors)}" if isinstance(extra, dict) else "mapping"
    return str(kind or "any")


def rules(node: dict[str, Any], *, required: bool) -> str:
    """The constraints the schema states on one value (and on the options of an ``anyOf``)."""
    found = ["required"] if required else []
    for part in [node, *node.get("anyOf", ())]:
        if "enum" in part:
            found.append("one of " + ", ".join(code(v) for v in part["enum"]))
        low = part.get("minimum")
        low_open = part.get("exclusiveMinimum")
        high = part.get("maximum")
        if low is not None and high is not None:
            found.append(f"{low} ≤ value ≤ {high}")
        elif low is not None:
            found.append(f"≥ {low}")
        elif high is not None:
            found.append(f"≤ {high}")
        if low_open is not None:
            found.append(f"> {low_open}" + (f", ≤ {high}" if high is not None and low is None else ""))
            if high is not None and low is None:
                found.remove(f"≤ {high}")
        if "pattern" in part:
            found.append(f"matches {code(part['pattern'])}")
        if "minItems" in part:
            found.append(f"at least {part['minItems']} item" + ("s" if part["minItems"] != 1 else ""))
    return "; ".join(found)


def default_of(body: dict[str, Any]) -> str:
    if "default" not in body:
        return ""
    value = body["default"]
    if isinstance(value, dict) and value:
        return "(below)"
    return code(json.dumps(value))


def cross_field_checks(definition: str | None) -> list[str]:
    """The messages of the checks :mod:`pipeline.spec.document`'s validators make on this object
    (``give either 'builtin' or 'path', not both``), its own and its base classes'; formatted parts
    shown as ``…``. The top level is checked by ``_TopLevel`` and, once merged, ``VariantSpec``."""
    messages: list[str] = []
    for name in [definition] if definition else ["_TopLevel", "VariantSpec"]:
        cls = getattr(spec, name)
        for klass in reversed(cls.__mro__):
            if klass.__module__ == spec.__name__:
                messages += [m for m in _raised(klass) if m not in messages]
    return messages


def _raised(klass: type) -> list[str]:
    """The literal messages of the errors raised in a class's own body."""
    messages: list[str] = []
    for node in ast.walk(ast.parse(inspect.getsource(klass))):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            text = _literal(node.exc.args[0])
            if text and text not in messages:
                messages.append(text)
    return messages


def _literal(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(part.value) if isinstance(part, ast.Constant) else "…" for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left), _literal(node.right)
        return f"{left or '…'}{right or '…'}" if left or right else None
    if isinstance(node, ast.IfExp):
        return _literal(node.body)
    return None


def _field_rows(section: Section, anchors: dict[str, str]) -> list[list[str]]:
    required = set(section.node.get("required", ()))
    rows = []
    for key, body in section.node.get("properties", {}).items():
        path = key if section.path == ROOT else f"{section.path}.{key}"
        rows.append(
            [
                code(path),
                type_of(body, anchors),
                default_of(body),
                rules(body, required=key in required),
                rst_to_markdown(body.get("description", "")),
            ]
        )
    return rows


def _names() -> str:
    tree_rows = [[code(name), len(tree), max(len(path) for path in tree)] for name, tree in trees.TREE_PRESETS.items()]
    preset_rows = [
        [code(name), g.num_layers, g.hidden_size, f"{g.num_heads} / {g.num_kv_heads}", g.vocab_size]
        for name, g in sorted(presets.PRESETS.items())
    ]
    gpu_rows = [
        [code(name), f"{g.memory_gib:.1f}", "{}.{}".format(*g.compute_capability), "yes" if g.supports_fp8 else "no"]
        for name, g in sorted(gpus.GPU_TYPES.items())
    ]
    return "\n".join(
        [
            "## Names the fields accept {#names}",
            "",
            "Tree presets (`speculative.medusa.choices`, `speculative.eagle.choices`; or give a list of paths "
            "such as `[[0], [0, 0], [1]]`):",
            "",
            table(["preset", "nodes", "depth"], tree_rows),
            "",
            "Architecture presets (`model.preset`: plan without the weights):",
            "",
            table(["preset", "layers", "hidden size", "attention / KV heads", "vocabulary"], preset_rows),
            "",
            "GPU types (`gpu.type`):",
            "",
            table(["type", "memory GiB", "compute capability", "FP8"], gpu_rows),
            "",
            "Embedded models (`model.builtin`): " + ", ".join(code(name) for name in embedded.EMBEDDED_MODELS) + ".",
        ]
    )


def render() -> str:
    schema = spec_json_schema(methods.names())
    found = sections(schema)
    anchors = {s.definition: s.path for s in found if s.definition}
    out = [
        GENERATED_NOTE.format(
            source="the JSON schema of `specdeploy schema` and the validators of `pipeline/spec/document.py`"
        ),
        "",
        "# Spec reference",
        "",
        'Every field of a spec file, by its path. Unknown keys are errors (with a "did you mean"), as are '
        "values of the wrong type: integers are not read from strings, and `4.7` is not an integer. "
        "Each problem is reported as `file:line:col key.path: message`, all at once, with exit code 2. "
        "`specdeploy schema` prints the same schema as JSON for editors. [Specs and variants]"
        "(../concepts/spec.md) explains how the pieces fit together; [the planner's rules]"
        "(planner-rules.md) are the TensorRT-LLM checks made after these.",
        "",
        "A variant (an item of `variants`) takes `name` plus any of the base fields: mappings are merged "
        "into the base's, and `null` resets a field to its default.",
    ]
    for section in found:
        title = "Top level" if section.path == ROOT else f"`{section.path}`"
        anchor = "top-level" if section.path == ROOT else section.path
        out += ["", f"## {title} {{#{anchor}}}", ""]
        description = section.node.get("description")
        if section.definition and description:
            out += [rst_to_markdown(" ".join(description.split())), ""]
        if section.also_at:
            out += ["The same fields at " + ", ".join(code(p) for p in section.also_at) + ".", ""]
        out.append(table(["field", "type", "default", "rules", "description"], _field_rows(section, anchors)))
        checks = cross_field_checks(section.definition)
        if checks:
            out += ["", "Checked across fields:", ""] + [f"- {code(message)}" for message in checks]
    out += ["", _names()]
    return "\n".join(out).rstrip() + "\n"
