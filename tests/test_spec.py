"""The spec loader: strict schema, located one-line errors, variant merging."""

from __future__ import annotations

import pytest

from pipeline.errors import InputError
from pipeline.spec.document import load_spec

BASE = """
name: demo
model:
  preset: llama-3.1-8b
parallel:
  tp: 2
"""


def error_of(path) -> str:
    with pytest.raises(InputError) as info:
        load_spec(path)
    return str(info.value)


def test_minimal_spec_has_one_variant_named_after_the_spec(write_spec):
    spec = load_spec(write_spec(BASE))
    assert [v.name for v in spec.variants] == ["demo"]
    assert spec.variants[0].parallel.tp == 2
    assert spec.variants[0].speculative.method == "auto"


def test_variants_override_the_base_and_null_resets(write_spec):
    spec = load_spec(
        write_spec(
            BASE
            + """
heads:
  medusa: {path: heads, num_heads: 4}
variants:
  - name: base
  - name: ft
    heads: null
    parallel: {tp: 4}
"""
        )
    )
    base, ft = spec.variants
    assert base.heads.medusa.num_heads == 4 and base.parallel.tp == 2
    assert ft.heads.medusa is None and ft.parallel.tp == 4
    assert ft.model.preset == "llama-3.1-8b"  # inherited


def test_error_names_file_line_column_and_variant_key_path(write_spec):
    path = write_spec(
        BASE
        + """
variants:
  - name: a
  - name: b
  - name: c
    speculative:
      lookahead:
        window: 0
"""
    )
    message = error_of(path)
    assert message == f"{path}:13:9 variants[2].speculative.lookahead.window: must be >= 1 (got 0)"


def test_inherited_bad_value_points_at_the_base_line(write_spec):
    path = write_spec("""
name: demo
model: {preset: llama-3.1-8b}
parallel:
  tp: zero
""")
    assert error_of(path) == f"{path}:4:3 parallel.tp: must be an integer (got str 'zero')"


def test_unknown_key_suggests_the_right_one(write_spec):
    path = write_spec(BASE + "bulid:\n  max_batch_size: 4\n")
    assert "unknown key 'bulid'; did you mean 'build'?" in error_of(path)
    path = write_spec(BASE + "build:\n  max_batchsize: 4\n", "b.yaml")
    message = error_of(path)
    assert message.startswith(f"{path}:7:3 build.max_batchsize: unknown key")
    assert "max_batch_size" in message


def test_duplicate_key_is_an_error(write_spec):
    path = write_spec(BASE + "parallel:\n  tp: 4\n")
    assert error_of(path) == f"{path}:6:1 parallel: duplicate key 'parallel'"


def test_bad_yaml_is_one_line_with_position(write_spec):
    path = write_spec("name: demo\nmodel: [unclosed\n")
    message = error_of(path)
    assert message.startswith(f"{path}:") and "invalid YAML" in message and "\n" not in message


def test_wrong_type_and_literal(write_spec):
    path = write_spec(BASE + "target: gpu\n")
    assert "target: must be one of 'tensorrt', 'reference' or 'pytorch' (got 'gpu')" in error_of(path)
    path = write_spec(BASE + "serving: {decoupled: 'yes'}\n", "b.yaml")
    assert "serving.decoupled: must be true or false" in error_of(path)


def test_unreadable_and_missing_files(tmp_path):
    with pytest.raises(InputError, match="spec file not found"):
        load_spec(tmp_path / "missing.yaml")
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    with pytest.raises(InputError, match="spec file is a folder, not a regular file"):
        load_spec(folder)


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", "/abs", "with space", ""])
def test_variant_names_cannot_escape_the_output_folder(write_spec, name):
    path = write_spec(BASE + f"variants:\n  - name: {name!r}\n")
    assert "variants[0].name" in error_of(path)


def test_duplicate_variant_names(write_spec):
    path = write_spec(BASE + "variants:\n  - name: a\n  - name: a\n")
    assert "variants[1].name: duplicate variant name 'a'" in error_of(path)


def test_all_problems_are_reported_at_once(write_spec):
    path = write_spec(
        BASE
        + """
variants:
  - name: a
    parallel: {tp: 0}
  - name: b
    build: {max_batch_size: -1}
"""
    )
    lines = error_of(path).splitlines()
    assert len(lines) == 2 and "variants[0].parallel.tp" in lines[0] and "variants[1].build.max_batch_size" in lines[1]


def test_model_source_rules(write_spec):
    assert "give 'builtin', 'path' or 'preset'" in error_of(write_spec("name: x\nmodel: {dtype: float32}\n"))
    assert "unknown builtin model" in error_of(write_spec("name: x\nmodel: {builtin: gpt5}\n", "b.yaml"))
    assert "unknown architecture preset" in error_of(write_spec("name: x\nmodel: {preset: nope}\n", "c.yaml"))


def test_tree_choices_are_validated(write_spec):
    path = write_spec(BASE + "speculative:\n  medusa:\n    choices: [[0], [1, 0, 0]]\n")
    assert "has no parent [1, 0]" in error_of(path)


def test_kv_fp8_needs_fp8_weights(write_spec):
    path = write_spec(BASE + "quantization: {kv_cache: fp8}\n")
    assert "kv_cache: fp8 needs weights: fp8" in error_of(path)


def test_yaml_tags_cannot_construct_objects(write_spec):
    path = write_spec(BASE + "description: !!python/object/apply:os.system ['true']\n")
    assert "YAML tag 'tag:yaml.org,2002:python/object/apply:os.system' is not allowed" in error_of(path)
    path = write_spec(BASE + "description: !!python/name:os.system ''\n", "b.yaml")
    assert "could not determine a constructor" in error_of(path)
