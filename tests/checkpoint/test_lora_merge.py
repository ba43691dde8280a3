"""LoRA merge against PEFT itself: merged weights equal merge_and_unload(), logits match the adapter model."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from pipeline.checkpoint.merge import PROVENANCE_FILE, merge_adapters

peft = pytest.importorskip("peft")

from tests.checkpoint.conftest import make_adapter  # noqa: E402

IDS = torch.tensor([[1, 5, 9, 33, 2, 71, 14, 60, 8, 3]])


def merged_reference(peft_model) -> dict[str, torch.Tensor]:
    merged = copy.deepcopy(peft_model).merge_and_unload()
    return {k: v.detach().clone() for k, v in merged.state_dict().items()}


def merge(tmp_path, base, adapters, name="merged"):
    out = tmp_path / name
    out.mkdir()
    return out, merge_adapters(base, adapters, out)


def assert_equal_weights(out, reference, atol=0.0):
    merged = load_file(out / "model.safetensors")
    assert set(merged) == set(reference)
    for name, tensor in reference.items():
        assert merged[name].dtype == tensor.dtype, name
        torch.testing.assert_close(merged[name], tensor, rtol=0, atol=atol, msg=name)


def logits_of(folder):
    from transformers import LlamaForCausalLM

    with torch.no_grad():
        return LlamaForCausalLM.from_pretrained(folder).eval()(IDS).logits


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"use_rslora": True, "r": 8, "lora_alpha": 16},
        {"rank_pattern": {"v_proj": 2}, "alpha_pattern": {"down_proj": 3}},
        {"use_dora": True},
        {"target_modules": ["q_proj", "embed_tokens"], "modules_to_save": ["lm_head"]},
    ],
    ids=["lora", "rslora", "patterns", "dora", "embedding+modules_to_save"],
)
def test_merge_equals_peft_merge_and_unload(tiny_llama, tmp_path, options):
    base = tiny_llama()
    peft_model = make_adapter(base.model, tmp_path / "adapter", **options)
    out, summary = merge(tmp_path, base.path, [tmp_path / "adapter"])
    assert_equal_weights(out, merged_reference(peft_model), atol=1e-6 if options.get("use_dora") else 0.0)
    with torch.no_grad():
        expected = peft_model(IDS).logits
    torch.testing.assert_close(logits_of(out), expected, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(expected, base.logits(IDS), atol=1e-2)  # the adapter changes the model
    assert summary.updated_tensors > 0 and summary.copied_tensors > 0
    assert json.loads((out / "config.json").read_text()) == json.loads((base.path / "config.json").read_text())
    assert json.loads((out / PROVENANCE_FILE).read_text())["adapters"][0]["r"] == options.get("r", 4)


def test_bfloat16_base_matches_peft(tiny_llama, tmp_path):
    model = tiny_llama().model.to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    peft_model = make_adapter(model, tmp_path / "adapter")
    out, _ = merge(tmp_path, tmp_path / "bf16", [tmp_path / "adapter"])
    assert_equal_weights(out, merged_reference(peft_model))


def test_adapters_apply_in_order_like_sequential_merge_and_unload(tiny_llama, tmp_path):
    base = tiny_llama()
    first = make_adapter(base.model, tmp_path / "first", seed=1, use_dora=True)
    stage_one = first.merge_and_unload()
    second = make_adapter(stage_one, tmp_path / "second", seed=2, use_dora=True, target_modules=["q_proj", "o_proj"])
    out, summary = merge(tmp_path, base.path, [tmp_path / "first", tmp_path / "second"])
    assert_equal_weights(out, merged_reference(second), atol=1e-6)
    assert len(summary.adapters) == 2


def test_adapter_model_bin_is_read_weights_only(tiny_llama, tmp_path):
    base = tiny_llama()
    peft_model = make_adapter(base.model, tmp_path / "adapter")
    folder = tmp_path / "adapter"
    tensors = load_file(folder / "adapter_model.safetensors")
    (folder / "adapter_model.safetensors").unlink()
    torch.save(tensors, folder / "adapter_model.bin")
    out, _ = merge(tmp_path, base.path, [folder])
    assert_equal_weights(out, merged_reference(peft_model))


def test_sharded_base_keeps_its_layout(tiny_llama, tmp_path):
    base = tiny_llama(save_kwargs={"max_shard_size": "40KB"})
    assert (base.path / "model.safetensors.index.json").exists()
    peft_model = make_adapter(base.model, tmp_path / "adapter")
    out, _ = merge(tmp_path, base.path, [tmp_path / "adapter"])
    shards = sorted(p.name for p in base.path.glob("*.safetensors"))
    assert sorted(p.name for p in out.glob("*.safetensors")) == shards
    merged = {k: v for shard in shards for k, v in load_file(out / shard).items()}
    for name, tensor in merged_reference(peft_model).items():
        assert torch.equal(merged[name], tensor), name


def test_a_retried_merge_writes_the_same_bytes(tiny_llama, tmp_path):
    base = tiny_llama()
    make_adapter(base.model, tmp_path / "adapter", use_dora=True)
    first, _ = merge(tmp_path, base.path, [tmp_path / "adapter"], name="first")
    second, _ = merge(tmp_path, base.path, [tmp_path / "adapter"], name="second")
    for path in first.iterdir():
        assert path.read_bytes() == (second / path.name).read_bytes(), path.name
