"""Cross-check against ModelOpt's own TRT-LLM exporter (an independent implementation of the format).

Same tiny model, two routes: ModelOpt ``export_tensorrt_llm_checkpoint`` straight from the torch
model, and our converter from the HF folder (bf16) or ModelOpt's HF FP8 export. Tensor by tensor,
names, shapes and values must agree, except for these documented, justified differences:

1. ``transformer.vocab_embedding.weight``: ModelOpt writes ``use_parallel_embedding: true`` and splits
   the table over vocab (dim 0) at tp>1; we replicate it (``use_parallel_embedding: false``, the
   TRT-LLM default and what its HF converter does). Our table equals the concatenation of theirs.
2. ``attention.k_cache_scaling_factor`` / ``v_cache_scaling_factor``: ModelOpt also writes the two
   per-tensor parts; TRT-LLM only reads ``kv_cache_scaling_factor`` (it merges the parts into it).
3. ``attention.kv_cache_scaling_factor``: ModelOpt clamps it to >= 1.0 ("recommended" default); we
   keep the calibrated max(k_scale, v_scale) of the HF export. Theirs == max(ours, 1.0).
4. FP8 codes may differ by one step of the shared grid: ModelOpt quantizes the original weights once
   with the shared scale; we only have the HF export's codes, which (a) were rounded to bf16 before
   quantization (~3 % of codes move one step) and (b) carry the part's own scale, so re-quantized
   parts (k/v inside qkv, the smaller of gate/up) are rounded twice. Scales are identical.
5. config.json: ModelOpt writes ``logits_dtype: float16``, ``exclude_modules: ["lm_head"]`` and
   bookkeeping keys (rank, producer, rotary_pct, ...); and without the rope_theta workaround it
   would omit ``rotary_base`` under transformers 5. All architectural keys must agree.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

FP8 = torch.float8_e4m3fn
pytestmark = pytest.mark.slow  # the session fixture imports ModelOpt (~10 s)

CONFIG_KEYS = (
    "architecture",
    "dtype",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "head_size",
    "norm_epsilon",
    "max_position_embeddings",
    "hidden_act",
    "position_embedding_type",
    "rotary_base",
)
MODELOPT_ONLY = ("k_cache_scaling_factor", "v_cache_scaling_factor")


def _tensors(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _fp8_step(x: torch.Tensor, scale: float) -> torch.Tensor:
    code = (x.abs() / scale).clamp_min(2.0**-6)
    return scale * torch.exp2(torch.floor(torch.log2(code)) - 3).clamp_min(2.0**-9)


def _compare(ours_dir, theirs_dir, tp: int) -> dict[str, int]:
    ours_cfg = json.loads((ours_dir / "config.json").read_text())
    theirs_cfg = json.loads((theirs_dir / "config.json").read_text())
    for key in CONFIG_KEYS:
        assert ours_cfg[key] == theirs_cfg[key], key
    assert ours_cfg["mapping"] == {k: theirs_cfg["mapping"][k] for k in ("world_size", "tp_size", "pp_size")}
    for key in ("quant_algo", "kv_cache_quant_algo"):
        assert ours_cfg["quantization"][key] == theirs_cfg["quantization"][key], key
    stats = {"requantized_codes": 0, "codes": 0}
    full_embedding = []
    for r in range(tp):
        ours, theirs = _tensors(ours_dir / f"rank{r}.safetensors"), _tensors(theirs_dir / f"rank{r}.safetensors")
        extra = {k for k in set(theirs) - set(ours) if not k.endswith(MODELOPT_ONLY)}
        assert not extra and not set(ours) - set(theirs), (extra, set(ours) - set(theirs))
        for name, mine in ours.items():
            other = theirs[name]
            assert mine.dtype == other.dtype, name
            if name == "transformer.vocab_embedding.weight":
                full_embedding.append(other)  # difference 1
                continue
            assert mine.shape == other.shape, name
            if name.endswith("kv_cache_scaling_factor"):
                assert torch.equal(other, mine.clamp_min(1.0)), name  # difference 3
            elif mine.dtype == FP8:
                scale = ours[name.replace(".weight", ".weights_scaling_factor")].item()
                assert scale == theirs[name.replace(".weight", ".weights_scaling_factor")].item(), name
                a, b = mine.float() * scale, other.float() * scale
                assert ((a - b).abs() <= 1.001 * _fp8_step(a.abs().maximum(b.abs()), scale)).all(), name  # diff. 4
                stats["requantized_codes"] += int((a != b).sum())
                stats["codes"] += a.numel()
            else:
                assert torch.equal(mine, other), name
    ours0 = _tensors(ours_dir / "rank0.safetensors")["transformer.vocab_embedding.weight"]
    assert torch.equal(ours0, torch.cat(full_embedding)[: ours0.shape[0]])
    return stats


@pytest.mark.parametrize("tp", [1, 2])
def test_bf16_matches_modelopt_export(modelopt_fp8, convert, tp):
    out, _ = convert(modelopt_fp8.base_dir, tp=tp, dtype="bfloat16")
    stats = _compare(out, modelopt_fp8.trt_base[tp], tp)
    assert stats["codes"] == 0


@pytest.mark.parametrize("tp", [1, 2])
def test_fp8_matches_modelopt_export(modelopt_fp8, convert, tp):
    out, _ = convert(modelopt_fp8.hf_fp8_dir, tp=tp, dtype="bfloat16", kv_cache_fp8=True)
    stats = _compare(out, modelopt_fp8.trt_fp8[tp], tp)
    assert stats["codes"] > 0
    # Most codes are identical; the one-step differences come from re-quantized parts only.
    assert stats["requantized_codes"] / stats["codes"] < 0.25, stats
