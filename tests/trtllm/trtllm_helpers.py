"""Helpers for the TensorRT-LLM contract tests: example specs, fake convert-stage checkpoints.

``checkpoint_config`` writes what the convert stage writes (a TensorRT-LLM checkpoint
config.json), built from the plan, so engine-config tests do not depend on real weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from pipeline.plan.types import VariantPlan
from pipeline.stages.runner import FINGERPRINT_FILE
from pipeline.trtllm.checkpoint_contract import checkpoint_problems

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SPECS = sorted((REPO / "specs").glob("*.yaml"))
PRESET_8B = "name: p\nmodel: {preset: llama-3.1-8b}\n"


def checkpoint_config(variant: VariantPlan) -> dict[str, Any]:
    arch, spec = variant.arch, variant.speculative
    config: dict[str, Any] = {
        "architecture": "LlamaForCausalLM",
        "dtype": variant.build.dtype,
        "logits_dtype": "float32",
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_size": arch.head_dim,
        "intermediate_size": arch.intermediate_size,
        "hidden_act": "silu",
        "norm_epsilon": arch.norm_epsilon,
        "position_embedding_type": "rope_gpt_neox",
        "max_position_embeddings": arch.max_position_embeddings,
        "rotary_base": arch.rope_theta,
        "rotary_scaling": (
            {"type": arch.rope_scaling["rope_type"], **arch.rope_scaling} if arch.rope_scaling else None
        ),
        "mapping": {"world_size": variant.world_size, "tp_size": variant.tp, "pp_size": variant.pp},
        "quantization": {
            "quant_algo": variant.quant.quant_algo,
            "kv_cache_quant_algo": variant.quant.kv_cache_quant_algo,
        },
    }
    if spec.medusa:
        config.update(
            architecture="MedusaForCausalLM",
            num_medusa_heads=spec.medusa.num_heads,
            num_medusa_layers=spec.medusa.num_layers,
            max_draft_len=spec.medusa.max_draft_len,
        )
    if spec.eagle:
        keys = ("dtype", "vocab_size", "hidden_size", "num_attention_heads", "rotary_base", "rotary_scaling")
        net = {k: config[k] for k in keys}  # what TensorRT-LLM's PretrainedConfig requires of it too
        config.update(
            architecture="EagleForCausalLM",
            num_eagle_layers=spec.eagle.num_eagle_layers,
            max_draft_len=spec.eagle.max_draft_len,
            max_non_leaves_per_layer=spec.eagle.max_non_leaves_per_layer,
            eagle_net_config={**net, "architecture": "LlamaForCausalLM", "num_hidden_layers": 1},
        )
    problems = checkpoint_problems(config)  # a fake checkpoint trtllm-build would refuse tests nothing
    assert problems == [], problems
    return config


def write_checkpoint(variant: VariantPlan, folder: Path | None = None, **overrides: Any) -> Path:
    """A convert-stage output folder: config.json + one tiny rank{r}.safetensors per rank, and the
    stage fingerprint every runner-written output has."""
    folder = folder or variant.stage("convert").output
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FINGERPRINT_FILE).write_text(json.dumps({"stage": "convert", "digest": "written by a test"}))
    config = checkpoint_config(variant) | overrides
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    for rank in range(variant.world_size):
        save_file({"rank": torch.full((4,), float(rank))}, str(folder / f"rank{rank}.safetensors"))
    return folder
