"""Spec values that used to pass `validate` and fail later, or build something that collides:
GPU ids that are negative or repeated, heads paths that name a file, variant names equal but for case."""

from __future__ import annotations

import os

import pytest

PRESET = "name: p\nmodel: {preset: llama-3.1-8b}\ngpu: {type: h100-sxm-80gb, count: 4}\n"


def errors_of(cli, write_spec, text: str) -> tuple[int, list[str]]:
    rc, _, err = cli("validate", str(write_spec(text)))
    assert "Traceback" not in err
    return rc, [line for line in err.splitlines() if line.startswith("error: ")]


@pytest.mark.parametrize(
    "serving, message",
    [
        ("{gpu_device_ids: [-1]}", ".yaml:5:28 serving.gpu_device_ids[0]: must be >= 0 (got -1)"),
        ("{gpu_device_ids: [0, 0, 1]}", "serving.gpu_device_ids: lists GPU 0 more than once ([0, 0, 1])"),
    ],
)
def test_negative_or_repeated_gpu_ids_are_spec_errors(cli, write_spec, serving, message):
    tp = 3 if "0, 0, 1" in serving else 1
    text = PRESET.replace("llama-3.1-8b}", f"llama-3.1-8b}}\nparallel: {{tp: {tp}}}") + f"serving: {serving}\n"
    rc, errors = errors_of(cli, write_spec, text)
    assert rc == 2 and len(errors) == 1 and message in errors[0], errors


def test_a_repeated_gpu_id_in_a_variant_is_located_in_the_variant(cli, write_spec):
    text = PRESET + "parallel: {tp: 2}\nvariants:\n  - name: a\n  - name: b\n    serving: {gpu_device_ids: [3, 3]}\n"
    rc, errors = errors_of(cli, write_spec, text)
    assert rc == 2 and len(errors) == 1, errors
    assert ".yaml:8:15 " in errors[0] and "variants[1].serving.gpu_device_ids: lists GPU 3 more than once" in errors[0]


@pytest.mark.parametrize("method", ["medusa", "eagle"])
@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_heads_path_naming_a_file_says_what_it_is_and_where_it_was_set(cli, write_spec, tmp_path, method, kind):
    heads = tmp_path / "heads.safetensors"
    if kind == "file":
        heads.write_bytes(b"not a folder")
    else:
        os.mkfifo(heads)
    text = PRESET + f"heads:\n  {method}: {{path: {heads}}}\nspeculative: {{method: {method}}}\n"
    rc, errors = errors_of(cli, write_spec, text)
    assert rc == 2 and len(errors) == 1, errors
    what = "a regular file" if kind == "file" else "a FIFO (named pipe)"
    column = 12 if method == "medusa" else 11  # the value after "  {method}: {path: "
    assert f".yaml:5:{column} heads.{method}.path: {heads} is {what}, not a folder" in errors[0], errors
    assert "[variant p]" in errors[0]


def test_unreadable_heads_are_located_at_the_heads_path(cli, write_spec, tmp_path):
    heads = tmp_path / "medusa"
    heads.mkdir()
    (heads / "config.json").write_text("{")
    (heads / "medusa_lm_head.safetensors").write_bytes(b"\x00" * 4)
    text = PRESET + f"heads:\n  medusa: {{path: {heads}}}\n"
    rc, errors = errors_of(cli, write_spec, text)
    assert rc == 2 and len(errors) == 1, errors
    assert ".yaml:5:12 heads.medusa.path:" in errors[0] and str(heads / "config.json") in errors[0]


@pytest.mark.parametrize("names", [("A", "a"), ("Legal-FT", "legal-ft")])
def test_variant_names_that_differ_only_by_case_are_refused(cli, write_spec, names):
    first, second = names
    text = PRESET + f"variants:\n  - name: {first}\n  - name: {second}\n"
    rc, errors = errors_of(cli, write_spec, text)
    assert rc == 2 and len(errors) == 1, errors
    assert f".yaml:6:5 variants[1].name: variant name '{second}' differs from '{first}' only by case" in errors[0]
    assert "case-insensitive filesystem" in errors[0]


def test_a_variant_named_like_the_spec_but_for_case_is_refused(cli, write_spec):
    rc, errors = errors_of(cli, write_spec, PRESET + "variants:\n  - name: P\n  - name: q\n")
    assert rc == 2 and len(errors) == 1 and "collides with the spec's repository" in errors[0], errors


def test_a_variant_named_like_a_shared_model_but_for_case_is_refused(cli, write_spec):
    rc, errors = errors_of(cli, write_spec, PRESET + "variants:\n  - name: Preprocessing\n  - name: q\n")
    assert rc == 2 and len(errors) == 1 and "is a model name of the spec's repository" in errors[0], errors
