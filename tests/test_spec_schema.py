"""`specdeploy schema`: the JSON schema of spec files, with the field docs, accepting every
example spec and rejecting what the loader rejects for the same reason (unknown keys, types)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from pipeline import methods
from pipeline.spec.json_schema import spec_json_schema
from tests.conftest import REPO

JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def problems(value: Any, node: dict[str, Any], defs: dict[str, Any], where: str = "") -> list[str]:
    """A small JSON-schema check (the subset pydantic emits: $ref, anyOf, type, enum/const,
    properties/additionalProperties/required, items); enough to test the schema with."""
    if "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    if "anyOf" in node:
        options = [problems(value, option, defs, where) for option in node["anyOf"]]
        return [] if any(not found for found in options) else min(options, key=len)
    if "const" in node and value != node["const"] or "enum" in node and value not in node["enum"]:
        return [f"{where}: {value!r} not allowed"]
    kind = node.get("type")
    if kind == "integer" and not (isinstance(value, int) and not isinstance(value, bool)):
        return [f"{where}: not an integer"]
    if kind == "number" and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return [f"{where}: not a number"]
    if kind in JSON_TYPES and not isinstance(value, JSON_TYPES[kind]):
        return [f"{where}: not {kind}"]
    found: list[str] = []
    if isinstance(value, dict):
        known = node.get("properties", {})
        found += [f"{where}.{key}: missing" for key in node.get("required", ()) if key not in value]
        for key, item in value.items():
            if key in known:
                found += problems(item, known[key], defs, f"{where}.{key}")
            elif node.get("additionalProperties") is False:
                found.append(f"{where}.{key}: unknown key")
    if isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            found += problems(item, node["items"], defs, f"{where}[{i}]")
    return found


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return spec_json_schema()


@pytest.mark.parametrize("spec", sorted(p.name for p in (REPO / "specs").glob("*.yaml")))
def test_every_example_spec_matches_the_schema(schema, spec):
    data = yaml.safe_load((REPO / "specs" / spec).read_text())
    assert problems(data, schema, schema["$defs"]) == []


@pytest.mark.parametrize(
    "text, expected",
    [
        ("name: x\nmodel: {preset: llama-3.1-8b}\nparalel: {tp: 2}\n", ".paralel: unknown key"),
        ("name: x\nmodel: {preset: llama-3.1-8b}\nparallel: {tp: two}\n", ".parallel.tp: not an integer"),
        ("name: x\nmodel: {preset: llama-3.1-8b}\ntarget: gpu\n", ".target: 'gpu' not allowed"),
        ("model: {preset: llama-3.1-8b}\n", ".name: missing"),
        (
            "name: x\nvariants:\n  - {name: a, build: {max_batch_sise: 4}}\n",
            ".variants[0].build.max_batch_sise: unknown key",
        ),
        ("name: x\nvariants:\n  - {build: {max_batch_size: 4}}\n", ".variants[0].name: missing"),
    ],
)
def test_the_schema_rejects_what_the_loader_rejects(schema, write_spec, cli, text, expected):
    assert expected in problems(yaml.safe_load(text), schema, schema["$defs"])
    rc, _, _ = cli("validate", str(write_spec(text)))
    assert rc == 2


def test_variant_overrides_need_no_nested_keys_and_may_reset(schema):
    # gpu.type is required in the base but a variant may override only the count, or reset heads.
    data = {
        "name": "x",
        "model": {"preset": "llama-3.1-8b"},
        "gpu": {"type": "l4"},
        "variants": [{"name": "a", "gpu": {"count": 2}, "heads": None}],
    }
    assert problems(data, schema, schema["$defs"]) == []
    assert problems({"name": "x", "gpu": {"count": 2}}, schema, schema["$defs"]) == [".gpu.type: missing"]


def test_every_field_is_documented(schema):
    def walk(node: Any, where: str) -> list[str]:
        undocumented = []
        if isinstance(node, dict):
            for name, body in node.get("properties", {}).items():
                if not body.get("description"):
                    undocumented.append(f"{where}.{name}")
            for key, value in node.items():
                undocumented += walk(value, f"{where}/{key}")
        return undocumented

    assert walk(schema, "") == []
    lookahead = schema["$defs"]["LookaheadSettings"]["properties"]
    assert lookahead["window"]["description"].startswith("W:")
    assert lookahead["ngram"]["description"].startswith("N:")
    assert lookahead["verification_set"]["description"].startswith("G:")


def test_schema_command_prints_the_schema(cli):
    rc, out, err = cli("schema")
    assert rc == 0, err
    assert json.loads(out) == json.loads(json.dumps(spec_json_schema(methods.names())))
