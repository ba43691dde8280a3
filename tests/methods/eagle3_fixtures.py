"""EAGLE-3 drafter folders as ModelOpt 0.47's ``EagleExporter`` writes them, for a tiny Llama base
(hidden 64, 4 heads of 16, 2 KV heads, vocabulary 1000): config.json and zero tensors of the exact
names and shapes (see tests/methods/test_eagle3_reader.py for the sources)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from pipeline.geometry import ModelGeometry

HIDDEN, VOCAB, HEADS, KV_HEADS, HEAD_DIM, INTER = 64, 1000, 4, 2, 16, 96
BASE = ModelGeometry(
    name="tiny", vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
    intermediate_size=128,
)  # fmt: skip
BASE8 = ModelGeometry(**{**BASE.to_dict(), "num_layers": 8})


def config(**changes) -> dict:
    """config.json as ModelOpt's template fills it for the tiny drafter (capture layers 0 and 1)."""
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "max_position_embeddings": 128,
        "model_type": "llama",
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": VOCAB,
        "draft_vocab_size": VOCAB,
        "attention_bias": False,
        "head_dim": HEAD_DIM,
        "mlp_bias": False,
        "rope_theta": 10000,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [0, 1],
            "use_aux_hidden_state": True,
            "use_input_layernorm_in_first_layer": True,
            "use_last_layernorm": True,
            "use_mtp_layernorm": False,
            "next_layer_regular": True,
            "parallel_draft_step": 1,
            "parallel_draft_heads_num_layers": 1,
        },
    }
    cfg.update(changes)
    return cfg


def tensors(captured: int = 2, draft_vocab: int = VOCAB) -> dict[str, np.ndarray]:
    def z(*shape: int) -> np.ndarray:
        return np.zeros(shape, dtype=np.float16)

    out = {
        "fc.weight": z(HIDDEN, HIDDEN * captured),
        "layers.0.hidden_norm.weight": z(HIDDEN),
        "layers.0.input_layernorm.weight": z(HIDDEN),
        "layers.0.post_attention_layernorm.weight": z(HIDDEN),
        "layers.0.self_attn.q_proj.weight": z(HEADS * HEAD_DIM, 2 * HIDDEN),
        "layers.0.self_attn.k_proj.weight": z(KV_HEADS * HEAD_DIM, 2 * HIDDEN),
        "layers.0.self_attn.v_proj.weight": z(KV_HEADS * HEAD_DIM, 2 * HIDDEN),
        "layers.0.self_attn.o_proj.weight": z(HIDDEN, HEADS * HEAD_DIM),
        "layers.0.mlp.gate_proj.weight": z(INTER, HIDDEN),
        "layers.0.mlp.up_proj.weight": z(INTER, HIDDEN),
        "layers.0.mlp.down_proj.weight": z(HIDDEN, INTER),
        "norm.weight": z(HIDDEN),
        "lm_head.weight": z(draft_vocab, HIDDEN),
    }
    if draft_vocab != VOCAB:
        out["d2t"] = np.full(draft_vocab, 3, dtype=np.int64)
    return out


def write(folder: Path, cfg: dict | list | None = None, weights: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if cfg is not None:
        (folder / "config.json").write_text(json.dumps(cfg))
    save_file(tensors() if weights is None else weights, str(folder / "model.safetensors"))
    return folder
