"""Converted checkpoints, run rank by rank, reproduce transformers' logits (fp32, max abs diff < 1e-4)."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.checkpoint import ReferenceModel, forward_logits
from pipeline.checkpoint.sharding import padded_vocab

TOL = 1e-4

SHAPES = {
    "gqa": {},
    "mha": {"num_key_value_heads": 4},
    "mqa": {"num_key_value_heads": 1},
    "tied_odd_vocab": {"tie_word_embeddings": True, "vocab_size": 101},
    "head_dim_not_hidden_over_heads": {"head_dim": 32, "num_key_value_heads": 2},
    "llama3_rope": {
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 50000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
    },
    "linear_rope": {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}},
    "three_layers": {"num_hidden_layers": 3},
}


def _ids(vocab: int, batch: int = 2, seq: int = 40, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2)])
def test_logits_match_transformers(tiny_llama, convert, shape, tp, pp):
    tiny = tiny_llama(**SHAPES[shape])
    ids = _ids(tiny.model.config.vocab_size)
    out, summary = convert(tiny.path, tp=tp, pp=pp)
    assert summary.files == ("config.json", *(f"rank{r}.safetensors" for r in range(tp * pp)))
    got = forward_logits(out, ids)
    assert got.shape == (2, 40, tiny.model.config.vocab_size)
    assert (got - tiny.logits(ids)).abs().max().item() < TOL


def test_kv_replication_and_padding_shapes(tiny_llama, convert):
    # 4 query heads, 1 KV head at tp=4: each rank holds 1 q head and a copy of the KV head.
    tiny = tiny_llama(num_key_value_heads=1, vocab_size=101, tie_word_embeddings=True)
    out, _ = convert(tiny.path, tp=4)
    from safetensors import safe_open

    embed = tiny.model.model.embed_tokens.weight.detach()
    k = tiny.model.model.layers[0].self_attn.k_proj.weight.detach()
    for r in range(4):
        with safe_open(str(out / f"rank{r}.safetensors"), "pt") as f:
            qkv = f.get_tensor("transformer.layers.0.attention.qkv.weight")
            assert qkv.shape == (16 + 16 + 16, 64)
            assert torch.equal(qkv[16:32], k)  # the single KV head, replicated
            lm = f.get_tensor("lm_head.weight")
            assert lm.shape == (padded_vocab(101, 4) // 4, 64)
            start = r * 26
            real = max(0, min(101 - start, 26))
            assert torch.equal(lm[:real], embed[start : start + real])
            assert not lm[real:].any()  # zero padding rows
            assert f.get_tensor("transformer.vocab_embedding.weight").shape == (101, 64)  # replicated


def test_config_json(tiny_llama, convert):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    tiny = tiny_llama(rope_parameters=rope, num_hidden_layers=3)
    out, summary = convert(tiny.path, tp=2, dtype="bfloat16")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architecture"] == "LlamaForCausalLM" and summary.architecture == "LlamaForCausalLM"
    assert cfg["dtype"] == "bfloat16"
    assert cfg["rotary_base"] == 500000.0  # from rope_parameters (transformers 5 has no rope_theta attribute)
    assert cfg["rotary_scaling"] == {
        "type": "llama3",
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    assert cfg["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}
    assert cfg["quantization"] == {"quant_algo": None, "kv_cache_quant_algo": None, "exclude_modules": None}
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_size"]) == (4, 2, 16)
    assert cfg["position_embedding_type"] == "rope_gpt_neox" and cfg["hidden_act"] == "silu"
    assert cfg["norm_epsilon"] == 1e-5 and cfg["num_hidden_layers"] == 3


def test_pp_layer_split_and_stage_contents(tiny_llama, convert):
    from safetensors import safe_open

    tiny = tiny_llama(num_hidden_layers=5)
    out, _ = convert(tiny.path, tp=1, pp=3)  # torch.tensor_split: 2 + 2 + 1 layers
    layers_per_rank = []
    for r in range(3):
        with safe_open(str(out / f"rank{r}.safetensors"), "pt") as f:
            keys = set(f.keys())
        layers_per_rank.append(len({k.split(".")[2] for k in keys if k.startswith("transformer.layers.")}))
        assert ("transformer.vocab_embedding.weight" in keys) == (r == 0)
        assert ("lm_head.weight" in keys) == (r == 2) and ("transformer.ln_f.weight" in keys) == (r == 2)
    assert layers_per_rank == [2, 2, 1]
    ids = _ids(96, batch=1)
    assert (forward_logits(out, ids) - tiny.logits(ids)).abs().max().item() < TOL


def test_sharded_input_and_legacy_rope_config(tiny_llama, convert):
    # Several safetensors shards + index, and a transformers-4 style config (rope_theta / rope_scaling).
    tiny = tiny_llama(
        save_kwargs={"max_shard_size": "40KB"},
        rope_parameters={"rope_type": "linear", "rope_theta": 20000.0, "factor": 2.0},
    )
    assert (tiny.path / "model.safetensors.index.json").exists()
    cfg_path = tiny.path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    del cfg["rope_parameters"]
    cfg["rope_theta"] = 20000.0
    cfg["rope_scaling"] = {"type": "linear", "factor": 2.0}
    cfg_path.write_text(json.dumps(cfg))
    out, _ = convert(tiny.path, tp=2)
    assert json.loads((out / "config.json").read_text())["rotary_base"] == 20000.0
    ids = _ids(96)
    assert (forward_logits(out, ids) - tiny.logits(ids)).abs().max().item() < TOL


@pytest.mark.parametrize("dtype,tol", [("bfloat16", 0.05), ("float16", 0.01)])
def test_half_precision_outputs(tiny_llama, convert, dtype, tol):
    tiny = tiny_llama()
    ids = _ids(96)
    out1, _ = convert(tiny.path, tp=1, dtype=dtype)
    out2, _ = convert(tiny.path, tp=2, dtype=dtype)
    a, b = forward_logits(out1, ids), forward_logits(out2, ids)
    assert (a - b).abs().max().item() < 1e-4  # same rounded weights, only the reduction order differs
    assert (a - tiny.logits(ids)).abs().max().item() < tol


def test_incremental_decoding_with_kv_cache_matches_full_forward(tiny_llama, convert):
    # The layer functions the runtime reuses: prefill, then one token at a time with the KV cache.
    tiny = tiny_llama(num_key_value_heads=1)
    out, _ = convert(tiny.path, tp=2, pp=2)
    model = ReferenceModel.load(out)
    ids = _ids(96, batch=1, seq=12)[0]
    full = model.forward(ids)
    hidden, past = model.hidden_states(ids[:8])
    steps = [model.logits_from_hidden(hidden)]
    for t in range(8, 12):
        hidden, past = model.hidden_states(ids[t : t + 1], past=past)  # caches come back extended
        steps.append(model.logits_from_hidden(hidden))
    assert (torch.cat(steps) - full).abs().max().item() < TOL


def test_progress_and_summary(tiny_llama, convert):
    tiny = tiny_llama()
    seen: list[tuple[int, int]] = []
    out, summary = convert(tiny.path, tp=2, pp=2, progress=lambda done, total: seen.append((done, total)))
    dones = [d for d, _ in seen]
    assert dones == sorted(dones) and seen[-1][0] == seen[-1][1] == summary.total_bytes
    assert summary.world_size == 4 and summary.num_tensors > 0 and summary.warnings == ()
    data = 0
    for r in range(4):
        raw = (out / f"rank{r}.safetensors").read_bytes()
        data += len(raw) - 8 - int.from_bytes(raw[:8], "little")
    assert data == summary.total_bytes
    assert sorted(p.name for p in out.iterdir()) == sorted(summary.files)  # no leftovers (*.partial)
