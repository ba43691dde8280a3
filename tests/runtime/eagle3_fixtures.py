"""An EAGLE-3 drafter for the embedded SmolLM2, made by ModelOpt itself and never downloaded.

``make_modelopt_drafter`` loads SmolLM2 from its folder into transformers, converts it with ModelOpt's
EAGLE-3 config (``mtsp.convert(model, [("eagle", EAGLE3_DEFAULT_CFG["config"])])``, random
init) and writes the drafter with ModelOpt's own HF export (``export_speculative_decoding``). The
drafter is sized like a SmolLM2 layer (9 heads of 64, 3 KV heads) with a smaller MLP, a reduced draft
vocabulary (so ``d2t`` and the drafter's own lm_head are exercised) and random norm weights, except
the first layer's ``input_layernorm``: ModelOpt 0.47's training forward applies it to the hidden half
too, TensorRT-LLM does not (pipeline/runtime/spec_decode/eagle3.py), and the two agree only while
it is all ones.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DRAFT_VOCAB = 4096
INTERMEDIATE = 512


@dataclass
class ModelOptDrafter:
    folder: Path  # the exported drafter
    model: Any  # the converted transformers model (base + eagle_module), float32, eval mode
    capture_layers: tuple[int, ...]


def make_modelopt_drafter(smollm2_dir: Path, out: Path, seed: int = 0) -> ModelOptDrafter:
    import modelopt.torch.speculative as mtsp
    import transformers
    from modelopt.torch.export import export_speculative_decoding

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2_dir), torch_dtype=torch.float32, local_files_only=True
    )
    base = model.config
    cfg = copy.deepcopy(mtsp.EAGLE3_DEFAULT_CFG["config"])
    cfg["eagle_use_torch_compile"] = False  # a GPU optimisation; on CPU it only compiles
    cfg["eagle_export_rope_scaling"] = {}  # keep the training RoPE in the exported config
    cfg["eagle_architecture_config"].update(
        num_attention_heads=base.num_attention_heads,
        num_key_value_heads=base.num_key_value_heads,
        head_dim=base.hidden_size // base.num_attention_heads,
        intermediate_size=INTERMEDIATE,
        draft_vocab_size=DRAFT_VOCAB,
    )
    mtsp.convert(model, [("eagle", cfg)])
    module = model.eagle_module
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # A draft vocabulary of sorted target ids (what scripts/calibrate_draft_vocab.py computes).
        rest = 64 + torch.randperm(base.vocab_size - 64, generator=generator)[: DRAFT_VOCAB - 64]
        targets = torch.cat([torch.arange(64), rest]).sort().values  # ids 0-63: special and byte tokens
        module.d2t.copy_(targets - torch.arange(DRAFT_VOCAB))
        for norm in (module.layers[0].hidden_norm, module.layers[0].post_attention_layernorm, module.norm):
            norm.weight.copy_(0.5 + torch.rand(norm.weight.shape, generator=generator))
    model.eval()
    export_speculative_decoding(model, export_dir=out)
    ids = tuple(model.eagle_config.eagle_aux_hidden_state_layer_ids)
    return ModelOptDrafter(out, model, tuple(sorted(ids)))
