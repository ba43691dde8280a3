"""The JSON schema of a spec file, for editors (e.g. YAML language servers) to check specs as
they are typed. ``specdeploy schema`` prints it.

A spec file is the base keys of a variant plus ``name``, ``description`` and ``variants``;
each variant is a ``name`` plus overrides that are merged into the base, so in a variant no
nested key is required and any key may be ``null`` (reset to its default). The loader
(:func:`pipeline.spec.document.load_spec`) stays the authority: it also checks what a schema cannot,
e.g. known presets, GPU types and named trees.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from pipeline.spec.document import VariantSpec, _TopLevel

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
PARTIAL_PREFIX = "Override"


def spec_json_schema(method_names: Sequence[str] = ()) -> dict[str, Any]:
    """The schema; ``method_names``: the methods ``speculative.method`` may name besides auto and best
    (:func:`pipeline.methods.names`; the spec, below the methods, does not know them)."""
    variant = VariantSpec.model_json_schema()
    top = _TopLevel.model_json_schema()
    defs = variant.pop("$defs", {})
    if method_names:
        method = defs["SpeculativeSpec"]["properties"]["method"]
        method["enum"] = ["auto", "best", *method_names]
    base = {key: value for key, value in variant["properties"].items() if key != "name"}
    override_defs = {PARTIAL_PREFIX + name: _partial(body) for name, body in defs.items()}
    override = _partial({key: value for key, value in variant.items() if key not in ("title", "description")})
    override["properties"]["name"] = variant["properties"]["name"]
    override["required"] = ["name"]
    override["description"] = "A variant: its name plus the keys it overrides."
    properties = {
        "name": top["properties"]["name"],
        "description": top["properties"]["description"],
        **base,
        "variants": {
            "description": top["properties"]["variants"]["description"],
            "type": "array",
            "minItems": 1,
            "items": {"$ref": f"#/$defs/{PARTIAL_PREFIX}Variant"},
        },
    }
    return {
        "$schema": SCHEMA_DIALECT,
        "title": "specdeploy spec",
        "description": "A base model description plus named variants that override it.",
        "type": "object",
        "properties": properties,
        "required": ["name"],
        "additionalProperties": False,
        "$defs": {**defs, **override_defs, f"{PARTIAL_PREFIX}Variant": override},
    }


def _partial(node: Any) -> Any:
    """A copy of a schema node where nothing is required, every property may be null, and
    references point at the partial copies of their definitions."""
    if isinstance(node, list):
        return [_partial(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "required":
            continue
        if key == "$ref":
            out[key] = value.replace("#/$defs/", f"#/$defs/{PARTIAL_PREFIX}")
        elif key == "properties":
            out[key] = {name: _nullable(_partial(body)) for name, body in value.items()}
        else:
            out[key] = _partial(value)
    return out


def _nullable(body: dict[str, Any]) -> dict[str, Any]:
    description = body.get("description")
    rest = {key: value for key, value in copy.deepcopy(body).items() if key not in ("description", "default")}
    nullable: dict[str, Any] = {"anyOf": [rest, {"type": "null"}]}
    if description:
        nullable["description"] = description
    return nullable
