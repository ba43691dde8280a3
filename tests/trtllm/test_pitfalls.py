"""Each TensorRT-LLM 1.2 pitfall (each from a NVIDIA/TensorRT-LLM issue or source file named in its test) is rejected or
repaired by the plan, the argv builder or the checkpoint check, before any GPU time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from trtllm_helpers import PRESET_8B, checkpoint_config, write_checkpoint

from pipeline.errors import InputError, StageError
from pipeline.stages.build import read_checkpoint
from pipeline.trtllm.build_command import trtllm_build_argv
from pipeline.trtllm.engine_config import check_checkpoint_config, check_engine_config, predict_engine_config

CKPT, ENGINE = Path("/ckpt"), Path("/engine")


def argv_value(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.fixture
def problems(plan_text):
    def collect(text: str) -> str:
        with pytest.raises(InputError) as info:
            plan_text(text)
        return str(info.value)

    return collect


def fasterdecoding_heads(folder: Path, num_heads: int, config_heads: int, hidden: int = 64, vocab: int = 1000) -> Path:
    """FasterDecoding's layout: ``{h}.0.linear.{weight,bias}`` ResBlock + ``{h}.1.weight`` lm_head."""
    folder.mkdir()
    tensors = {}
    for h in range(num_heads):
        tensors |= {
            f"{h}.0.linear.weight": torch.zeros(hidden, hidden),
            f"{h}.0.linear.bias": torch.zeros(hidden),
            f"{h}.1.weight": torch.zeros(vocab, hidden),
        }
    save_file(tensors, str(folder / "medusa_lm_head.safetensors"))
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": config_heads, "medusa_num_layers": 1}))
    return folder


# --- Medusa -------------------------------------------------------------------------------------


def test_medusa_head_count_comes_from_the_weights_not_a_default(plan_text, hf_config_dir, tmp_path):
    """TensorRT-LLM defaults num_medusa_heads to 4 and FasterDecoding's config under-reports; the
    weights decide, and a checkpoint carrying another count is refused before trtllm-build."""
    model = hf_config_dir()
    fasterdecoding_heads(tmp_path / "heads", num_heads=3, config_heads=2)
    variant = plan_text(
        f"name: m\nmodel: {{path: {model}}}\nheads:\n  medusa: {{path: {tmp_path / 'heads'}}}\n"
        "speculative:\n  medusa: {choices: chain_3}\n"
    )[0]
    assert variant.speculative.medusa.num_heads == 3
    assert any("says 2 Medusa heads but the weights hold 3" in note for note in variant.notes)
    assert check_checkpoint_config(checkpoint_config(variant), variant) == []
    write_checkpoint(variant, num_medusa_heads=4)
    with pytest.raises(StageError, match="num_medusa_heads is 4, the plan needs 3"):
        read_checkpoint(variant, variant.stage("convert").output)


def test_fp8_medusa_heads_are_rejected(problems):  # NVIDIA/TensorRT-LLM#2115
    text = PRESET_8B + "heads:\n  medusa: {path: x, num_heads: 4}\nquantization: {weights: fp8, quantize_heads: true}\n"
    assert "TensorRT-LLM#2115" in problems(text)


def test_weight_only_quantization_is_not_offered(problems):  # NVIDIA/TensorRT-LLM#1845
    message = problems(PRESET_8B + "quantization: {weights: int8_wo}\n")
    assert "quantization.weights: must be one of" in message and "'fp8'" in message


def test_medusa_engine_carries_what_the_runtime_needs(plan_text):  # NVIDIA/TensorRT-LLM#1449
    variant = plan_text(PRESET_8B + "heads:\n  medusa: {path: x, num_heads: 4}\n")[0]
    config = predict_engine_config(variant, checkpoint_config(variant), output_dir=ENGINE)
    assert config["build_config"]["speculative_decoding_mode"] == 4
    del config["pretrained_config"]["num_medusa_heads"]
    assert "pretrained_config.num_medusa_heads is missing (the plan needs 4)" in check_engine_config(config, variant)


# --- EAGLE ----------------------------------------------------------------------------------------


def test_eagle_without_fc_bias_is_repaired_with_a_note(plan_text, hf_config_dir, tmp_path):  # #2588
    model = hf_config_dir()
    (tmp_path / "e").mkdir()
    save_file(
        {"fc.weight": torch.zeros(64, 128), "layers.0.self_attn.q_proj.weight": torch.zeros(64, 64)},
        str(tmp_path / "e" / "model.safetensors"),
    )
    (tmp_path / "e" / "config.json").write_text(json.dumps({"hidden_size": 64}))
    variant = plan_text(f"name: m\nmodel: {{path: {model}}}\nheads:\n  eagle: {{path: {tmp_path / 'e'}}}\n")[0]
    assert any("no fc.bias" in note and "writes zeros" in note for note in variant.notes)


def test_eagle_fp8_is_flagged_experimental(plan_text):  # NVIDIA/TensorRT-LLM#3207, #7842
    variant = plan_text(PRESET_8B + "heads:\n  eagle: {path: e}\nquantization: {weights: fp8}\n")[0]
    assert any("experimental" in note for note in variant.notes)


def test_eagle_needs_a_llama_base(problems, hf_config_dir):  # #2673, #10396
    model = hf_config_dir(architectures=["MistralForCausalLM"])  # refused as a base for any method
    assert "unsupported architecture MistralForCausalLM" in problems(
        f"name: m\nmodel: {{path: {model}}}\nheads:\n  eagle: {{path: e}}\n"
    )


def test_eagle_limits(problems, plan_text):
    eagle = PRESET_8B + "heads:\n  eagle: {path: e}\n"
    assert "does not support pipeline parallelism" in problems(eagle + "parallel: {pp: 2}\n")
    assert "max_batch_size <= 512" in problems(eagle + "build: {max_batch_size: 513}\n")
    assert "max_draft_len: must be <= 256" in problems(eagle + "speculative:\n  eagle: {max_draft_len: 300}\n")
    dynamic = plan_text(eagle + "speculative:\n  eagle: {dynamic_tree: true, dynamic_tree_max_top_k: 10}\n")[0]
    assert dynamic.build.max_draft_len == 256  # 310 nodes possible, capped at the builder's limit
    # EAGLE-1 only (one drafter layer); EAGLE-3 lives in the PyTorch backend.
    assert "must be <= 1 (got 2)" in problems(PRESET_8B + "heads:\n  eagle: {path: e, num_layers: 2}\n")
    variant = plan_text(eagle + "build: {max_batch_size: 512}\n")[0]
    argv = trtllm_build_argv(variant, CKPT, ENGINE, visible_gpus=1)
    assert argv_value(argv, "--use_paged_context_fmha") == "enable"  # EAGLE needs paged context FMHA


def test_reduce_fusion_is_refused_for_eagle(plan_text):  # trtllm-build silently drops it
    variant = plan_text(
        PRESET_8B + "heads:\n  eagle: {path: e}\nparallel: {tp: 2}\nbuild:\n  extra_flags: {reduce_fusion: enable}\n"
    )[0]
    with pytest.raises(InputError, match="EagleForCausalLM"):
        trtllm_build_argv(variant, CKPT, ENGINE, visible_gpus=2)


# --- Lookahead --------------------------------------------------------------------------------------


def test_lookahead_build_and_serve_must_agree(problems, plan_text):  # tensorrtllm_backend#710/#711
    assert "16 does not match (W=4, N=3, G=4), which needs 15" in problems(
        PRESET_8B + "speculative:\n  lookahead: {max_draft_len: 16}\n"
    )
    variant = plan_text(PRESET_8B + "speculative:\n  lookahead: {max_draft_len: 15}\n")[0]
    assert argv_value(trtllm_build_argv(variant, CKPT, ENGINE, visible_gpus=1), "--max_draft_len") == "15"


def test_lookahead_draft_len_is_always_passed(plan_text):  # #2641, tensorrtllm_backend#473
    variant = plan_text(PRESET_8B + "speculative:\n  lookahead: {window: 7, ngram: 7, verification_set: 7}\n")[0]
    argv = trtllm_build_argv(variant, CKPT, ENGINE, visible_gpus=1)
    assert argv_value(argv, "--speculative_decoding_mode") == "lookahead_decoding"
    assert argv_value(argv, "--max_draft_len") == "83"


def test_engine_without_draft_tokens_is_caught(plan_text):  # tensorrtllm_backend#473
    variant = plan_text(PRESET_8B)[0]
    config = predict_engine_config(variant, checkpoint_config(variant), output_dir=ENGINE)
    config["build_config"] |= {"max_draft_len": 0, "speculative_decoding_mode": 1}
    found = check_engine_config(config, variant)
    assert any("max_draft_len is 0, the plan needs 15" in p for p in found)
    assert any("the plan needs 8 (LOOKAHEAD_DECODING)" in p for p in found)


def test_context_logits_with_speculation_are_refused(plan_text):  # trtllm-build raises late
    variant = plan_text(PRESET_8B + "build:\n  extra_flags: {gather_all_token_logits: true}\n")[0]
    with pytest.raises(InputError, match="build.extra_flags.gather_all_token_logits"):
        trtllm_build_argv(variant, CKPT, ENGINE, visible_gpus=1)


# --- checkpoint facts: rope scaling, FP8, parallelism -----------------------------------------------


def test_llama3_rope_scaling_is_kept_whole(plan_text):  # the Medusa/EAGLE converters keep only the type
    variant = plan_text(PRESET_8B + "heads:\n  eagle: {path: e}\n")[0]
    assert variant.arch.rope_scaling["rope_type"] == "llama3" and variant.arch.rope_scaling["factor"] == 8.0
    config = checkpoint_config(variant)
    assert check_checkpoint_config(config, variant) == []
    truncated = config | {"rotary_scaling": {"type": "llama3"}}
    assert any(
        "rotary_scaling.factor is None, the model's is 8.0" in p for p in check_checkpoint_config(truncated, variant)
    )
    config["eagle_net_config"]["rotary_scaling"] = None
    assert any("eagle_net_config.rotary_scaling is missing" in p for p in check_checkpoint_config(config, variant))


def test_fp8_checkpoint_must_say_fp8(plan_text):  # #10034 / Model-Optimizer#500: use quantize, verify
    variant = plan_text(PRESET_8B + "quantization: {weights: fp8, kv_cache: fp8}\n")[0]
    assert [stage.name for stage in variant.stages][:2] == ["quantize", "convert"]
    lost = checkpoint_config(variant) | {"quantization": {"quant_algo": None, "kv_cache_quant_algo": "FP8"}}
    assert any("quant_algo is None, the plan needs 'FP8'" in p for p in check_checkpoint_config(lost, variant))


def test_fp8_on_an_a100_is_rejected(problems):
    assert "FP8 needs compute capability >= 8.9" in problems(
        PRESET_8B + "quantization: {weights: fp8}\ngpu: {type: a100-80gb}\n"
    )


def test_world_size_must_equal_tp_times_pp(problems, plan_text):
    assert "2 GPUs cannot hold world size tp*pp = 4" in problems(
        PRESET_8B + "parallel: {tp: 2, pp: 2}\ngpu: {type: h100-sxm-80gb, count: 2}\n"
    )
    assert "lists 3 GPUs; the engine needs tp*pp = 4" in problems(
        PRESET_8B + "parallel: {tp: 2, pp: 2}\nserving: {gpu_device_ids: [0, 1, 2]}\n"
    )
    variant = plan_text(PRESET_8B + "parallel: {tp: 2, pp: 2}\n")[0]
    write_checkpoint(variant, mapping={"world_size": 2, "tp_size": 2, "pp_size": 1})
    with pytest.raises(StageError, match="mapping.pp_size is 1, the plan needs 2"):
        read_checkpoint(variant, variant.stage("convert").output)
