"""`validate` reads LoRA adapters as the merge will: headers, ranks, target modules against the base.

Each case used to pass ``validate`` and fail only in ``engine``; now ``validate`` refuses it with
exit 2 at the spec's ``model.adapter`` line, naming the adapter's file.
"""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from tests.checkpoint.conftest import make_adapter, random_llama
from tests.preflight_fixtures import model, spec_for  # noqa: F401  (model: a fixture)

peft = pytest.importorskip("peft")


@pytest.fixture
def adapter(model, tmp_path):  # noqa: F811  (the fixture above)
    folder = tmp_path / "adapter"
    make_adapter(random_llama(0), folder)
    return folder


def validate(cli, write_spec, text: str) -> tuple[int, list[str]]:
    rc, _, err = cli("validate", str(write_spec(text)))
    assert "Traceback" not in err
    return rc, [line for line in err.splitlines() if line.startswith("error: ")]


def with_adapter(model, adapters) -> str:  # noqa: F811
    text = spec_for(model)
    value = json.dumps([str(a) for a in adapters]) if isinstance(adapters, list) else str(adapters)
    return text.replace("  dtype: float32\n", f"  dtype: float32\n  adapter: {value}\n")


def edit_config(folder, **changes):
    path = folder / "adapter_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


Q0 = "base_model.model.model.layers.0.self_attn.q_proj"


def test_rank_that_disagrees_with_the_tensors_fails_validate(cli, write_spec, model, adapter):  # noqa: F811
    assert validate(cli, write_spec, with_adapter(model, adapter)) == (0, [])  # the adapter as PEFT saved it
    edit_config(adapter, r=8)
    rc, errors = validate(cli, write_spec, with_adapter(model, adapter))
    assert rc == 2 and len(errors) == 1, errors
    assert ".yaml:5:3 model.adapter:" in errors[0] and "rank does not match r=8" in errors[0]
    assert str(adapter / "adapter_model.safetensors") in errors[0] and "[variant tiny]" in errors[0]


def test_target_module_the_base_lacks_fails_validate(cli, write_spec, model, adapter):  # noqa: F811
    edit_config(adapter, target_modules=["q_proj", "v_proj", "down_proj", "c_attn"])
    rc, errors = validate(cli, write_spec, with_adapter(model, adapter))
    assert rc == 2 and "model.adapter:" in errors[0] and "target module 'c_attn' is absent" in errors[0], errors


def test_truncated_adapter_weights_fail_validate(cli, write_spec, model, adapter):  # noqa: F811
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    rc, errors = validate(cli, write_spec, with_adapter(model, adapter))
    assert rc == 2 and "model.adapter:" in errors[0], errors
    assert f"{weights}: truncated safetensors file" in errors[0]


def test_nan_lora_alpha_fails_validate(cli, write_spec, model, adapter):  # noqa: F811
    path = adapter / "adapter_config.json"
    path.write_text(path.read_text().replace('"lora_alpha": 8', '"lora_alpha": NaN'))
    rc, errors = validate(cli, write_spec, with_adapter(model, adapter))
    assert rc == 2 and "model.adapter:" in errors[0], errors
    assert "lora_alpha must be a positive finite number, got nan" in errors[0]


def test_the_second_adapter_of_a_list_is_named_by_its_index(cli, write_spec, model, adapter, tmp_path):  # noqa: F811
    second = tmp_path / "second"
    make_adapter(random_llama(0), second, seed=2)
    tensors = load_file(second / "adapter_model.safetensors")
    tensors[Q0 + ".lora_A.weight"] = tensors[Q0 + ".lora_A.weight"][:, :32].contiguous()  # [r, 32]: not the base's 64
    save_file(tensors, second / "adapter_model.safetensors")
    rc, errors = validate(cli, write_spec, with_adapter(model, [adapter, second]))
    assert rc == 2 and len(errors) == 1, errors
    assert "model.adapter[1]:" in errors[0] and "trained on another model" in errors[0]
    assert str(second / "adapter_model.safetensors") in errors[0]


def test_an_adapter_is_read_even_before_the_base_weights_arrive(cli, write_spec, adapter, tmp_path):
    folder = tmp_path / "config-only"
    folder.mkdir()
    random_llama(0).config.to_json_file(folder / "config.json")
    edit_config(adapter, r=2)
    rc, errors = validate(cli, write_spec, with_adapter(folder, adapter))
    assert rc == 2 and "model.adapter:" in errors[0] and "rank does not match r=2" in errors[0], errors


def test_an_adapter_path_naming_a_file_says_what_it_is(cli, write_spec, model, adapter):  # noqa: F811
    weights = adapter / "adapter_model.safetensors"
    rc, errors = validate(cli, write_spec, with_adapter(model, weights))
    assert rc == 2 and len(errors) == 1, errors
    assert f".yaml:5:3 model.adapter: {weights}: adapter folder is a regular file, not a folder" in errors[0]


def test_a_shared_fine_tunes_adapter_is_read_like_a_merged_ones(cli, write_spec, model, adapter):  # noqa: F811
    """serving.lora: shared: the lora stage converts the adapter at engine time; validate reads its tensors
    against its adapter_config.json first, as it does for a merged one."""
    text = (
        f"name: tiny\nmodel: {{path: {model}, dtype: float32}}\ntarget: reference\nvariants:\n  - name: base\n"
        f"  - name: ft\n    model: {{adapter: {adapter}}}\n    serving: {{lora: shared}}\n"
    )
    assert validate(cli, write_spec, text) == (0, [])
    edit_config(adapter, r=8)
    rc, errors = validate(cli, write_spec, text)
    assert rc == 2 and len(errors) == 1, errors
    assert "model.adapter:" in errors[0] and "rank does not match r=8" in errors[0] and "[variant ft]" in errors[0]


def test_a_plan_error_and_another_variants_adapter_problem_are_said_together(cli, write_spec, model, adapter, tmp_path):  # noqa: F811
    """validate says every problem at once: a missing adapter folder (the plan's) does not hide another
    variant's rank mismatch (read from its files)."""
    edit_config(adapter, r=8)
    text = (
        f"name: tiny\nmodel: {{path: {model}, dtype: float32}}\ntarget: reference\nvariants:\n  - name: base\n"
        f"  - name: ft\n    model: {{adapter: {adapter}}}\n"
        f"  - name: lost\n    model: {{adapter: {tmp_path / 'nowhere'}}}\n"
    )
    rc, errors = validate(cli, write_spec, text)
    assert rc == 2 and len(errors) == 2, errors
    assert any("adapter folder not found" in e and str(tmp_path / "nowhere") in e for e in errors), errors
    assert any("rank does not match r=8" in e and "[variant ft]" in e for e in errors), errors
