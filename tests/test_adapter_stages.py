"""model.adapter in a spec: the plan's merge stage, one merge per base + adapter list, and the engine it feeds."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from pipeline.checkpoint import forward_logits
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec
from tests.quantize.conftest import build_tiny_llama

peft = pytest.importorskip("peft")


def _adapter(model_dir, folder, seed, **config):
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(seed)
    lora = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"], init_lora_weights=False, **config
    )
    model = peft.get_peft_model(copy.deepcopy(base), lora).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    model.save_pretrained(folder)
    return model


@pytest.fixture
def fleet(tmp_path, write_spec):
    model = build_tiny_llama(tmp_path / "tiny")
    peft_model = _adapter(model, tmp_path / "ft", seed=1)
    spec = write_spec(f"""
        name: tiny-fleet
        model: {{path: {model}, dtype: float32}}
        build: {{max_batch_size: 2, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}}
        target: reference
        serving: {{lora: merged}}  # the merge stage under test (auto would serve ft from the base's engine)
        variants:
          - name: base
          - name: ft
            model: {{adapter: {tmp_path / "ft"}}}
          - name: ft-again
            model: {{adapter: [{tmp_path / "ft"}]}}
            build: {{max_batch_size: 1}}
        """)
    return spec, model, peft_model


def test_plan_merges_once_per_base_and_adapter_list(fleet, tmp_path):
    spec, model, _ = fleet
    plan = make_plan(load_spec(spec), OutputRoots(tmp_path / "engines", tmp_path / "repo", tmp_path / "cache"))
    base, ft, again = plan.variants
    assert [s.name for s in base.stages] == ["convert", "build", "package"]
    assert [s.name for s in ft.stages] == ["merge", "convert", "build", "package"]
    assert ft.stage("merge") == again.stage("merge")  # one folder, one fingerprint: the second run skips
    assert ft.stage("merge").output == tmp_path / "engines" / "ft" / "merged"
    assert ft.stage("convert").inputs["model"] == ft.stage("merge").output
    assert base.stage("convert").inputs["model"] == model


def test_engine_merges_then_converts_the_merged_model(fleet, cli, tmp_path):
    spec, _, peft_model = fleet
    rc, out, err = cli("engine", str(spec))
    assert rc == 0, err
    assert "[ft] merge: done" in out and "[ft-again] merge: up to date, skipped" in out
    assert "[base] merge" not in out
    ids = torch.tensor([[1, 5, 9, 12, 7, 4, 30]])
    with torch.no_grad():
        expected = peft_model(ids).logits
    for variant in ("ft", "ft-again"):
        logits = forward_logits(tmp_path / "engines" / variant / "checkpoint", ids)
        torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    base_logits = forward_logits(tmp_path / "engines" / "base" / "checkpoint", ids)
    assert not torch.allclose(base_logits, expected, atol=1e-2)
    merged = tmp_path / "engines" / "ft" / "merged"
    assert json.loads((merged / "specdeploy_merge.json").read_text())["updated_tensors"] == 6
    assert (merged / "tokenizer.json").exists()
    rc, out, err = cli("engine", str(spec))
    assert rc == 0, err
    assert out.count("up to date, skipped") == 4 + 4 + 3 + 1  # the variants' stages, the spec's repository


@pytest.mark.parametrize(
    "adapter, message",
    [
        ("missing-folder", "adapter folder not found"),
        ("[]", "non-empty list"),
    ],
)
def test_bad_adapter_entries_are_spec_errors(tmp_path, write_spec, cli, adapter, message):
    model = build_tiny_llama(tmp_path / "tiny")
    spec = write_spec(f"name: t\nmodel: {{path: {model}, adapter: {adapter}}}\ntarget: reference\n")
    rc, _, err = cli("validate", str(spec))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and message in errors[0] and "spec.yaml:2" in errors[0]


def test_adapter_for_another_base_model_is_refused_at_plan_time(tmp_path, write_spec, cli):
    model = build_tiny_llama(tmp_path / "tiny")
    _adapter(model, tmp_path / "ft", seed=1)
    config_file = tmp_path / "ft" / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = "meta-llama/Llama-3.1-8B"
    config_file.write_text(json.dumps(config))
    spec = write_spec(f"name: t\nmodel: {{path: {model}, adapter: {tmp_path / 'ft'}}}\ntarget: reference\n")
    rc, _, err = cli("validate", str(spec))
    assert rc == 2 and "base_model_name_or_path 'meta-llama/Llama-3.1-8B' is not the spec's model" in err
    config["base_model_name_or_path"] = f"some-org/{model.name}"  # the same model under its hub name
    config_file.write_text(json.dumps(config))
    rc, _, err = cli("validate", str(spec))
    assert rc == 0, err


def test_quantize_reads_the_merged_checkpoint(fleet, tmp_path, write_spec):
    _, model, _ = fleet
    spec = write_spec(
        f"""
        name: fp8-ft
        model: {{path: {model}, adapter: {tmp_path / "ft"}}}
        quantization: {{weights: fp8}}
        target: reference
        """,
        name="fp8.yaml",
    )
    plan = make_plan(load_spec(spec), OutputRoots(tmp_path / "engines", tmp_path / "repo", tmp_path / "cache"))
    (variant,) = plan.variants
    assert [s.name for s in variant.stages] == ["merge", "quantize", "convert", "build", "package"]
    assert variant.stage("quantize").inputs["model"] == variant.stage("merge").output
    assert variant.stage("convert").inputs["model"] == variant.stage("quantize").output
