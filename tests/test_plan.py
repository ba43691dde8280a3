"""The planner: method choice, TensorRT-LLM 1.2 rules (each with a failing and a passing case),
derived build numbers and the memory estimate."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from pipeline.methods.lookahead import lookahead_max_draft_len


def medusa_heads(folder, num_heads: int, config_heads: int | None = None, hidden: int = 64, vocab: int = 1000):
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for h in range(num_heads):
        tensors[f"{h}.0.linear.weight"] = torch.zeros(hidden, hidden)
        tensors[f"{h}.0.linear.bias"] = torch.zeros(hidden)
        tensors[f"{h}.1.weight"] = torch.zeros(vocab, hidden)
    save_file(tensors, str(folder / "medusa_lm_head.safetensors"))
    (folder / "config.json").write_text(
        json.dumps({"medusa_num_heads": config_heads or num_heads, "medusa_num_layers": 1})
    )
    return folder


def eagle_heads(folder, *, with_bias: bool = True, hidden: int = 64):
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {
        "fc.weight": torch.zeros(hidden, 2 * hidden),
        "layers.0.self_attn.q_proj.weight": torch.zeros(hidden, hidden),
    }
    if with_bias:
        tensors["fc.bias"] = torch.zeros(hidden)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"hidden_size": hidden}))
    return folder


PRESET_8B = "name: p\nmodel: {preset: llama-3.1-8b}\n"


# --- method choice -------------------------------------------------------------------------


def test_auto_prefers_eagle_then_medusa_then_lookahead(plan_of, tmp_path, hf_config_dir):
    medusa_heads(tmp_path / "m", 4)
    eagle_heads(tmp_path / "e")
    text = (
        f"name: p\nmodel: {{path: {hf_config_dir()}}}\nspeculative: {{medusa: {{choices: chain_4}}}}\n"
        "heads:\n  medusa: {path: m}\n  eagle: {path: e}\nvariants:\n"
        "  - name: both\n  - name: medusa-only\n    heads: {eagle: null}\n  - name: none\n    heads: null\n"
    )
    methods = {v.name: v.method for v in plan_of(text).variants}
    assert methods == {"both": "eagle", "medusa-only": "medusa", "none": "lookahead"}


def test_explicit_method_without_heads_is_an_error(problems_of):
    assert "medusa needs heads.medusa.path" in problems_of(PRESET_8B + "speculative: {method: medusa}\n")


def test_method_none_builds_plain(plan_of):
    variant = plan_of(PRESET_8B + "speculative: {method: none}\n").variants[0]
    assert variant.build.speculative_decoding_mode is None and variant.build.max_draft_len == 0
    assert variant.build.engine_max_seq_len == variant.build.max_seq_len


def test_max_beam_width_reaches_the_build_and_only_without_speculation(plan_of, problems_of, tmp_path):
    from pipeline.trtllm.build_command import trtllm_build_argv
    from pipeline.trtllm.engine_config import predict_engine_config

    variant = plan_of(PRESET_8B + "speculative: {method: none}\nbuild: {max_beam_width: 4}\n").variants[0]
    assert variant.build.max_beam_width == 4
    argv = trtllm_build_argv(variant, tmp_path / "ckpt", tmp_path / "engine", visible_gpus=None)
    assert argv[argv.index("--max_beam_width") + 1] == "4"
    predicted = predict_engine_config(variant, {"mapping": {}}, output_dir=tmp_path / "engine")
    assert predicted["build_config"]["max_beam_width"] == 4
    message = problems_of(PRESET_8B + "speculative: {method: lookahead}\nbuild: {max_beam_width: 2}\n")
    assert "beam width 1 only" in message and "max_beam_width" in message


# --- ngram -----------------------------------------------------------------------------------


def test_ngram_plans_on_the_reference_target_as_external_draft_tokens(plan_of, tmp_path):
    text = (
        PRESET_8B + "target: reference\nspeculative: {method: ngram, ngram: {max_draft_len: 5, is_use_oldest: false}}\n"
    )
    variant = plan_of(text).variants[0]
    assert variant.method == "ngram" and variant.build.max_draft_len == 5  # K
    assert variant.build.speculative_decoding_mode == "draft_tokens_external"
    assert variant.speculative.ngram is not None and not variant.speculative.ngram.use_oldest


def test_ngram_on_the_engine_target_is_refused_with_what_runs_there(problems_of):
    message = problems_of(PRESET_8B + "speculative: {method: ngram}\n")
    assert "NGram runs on target reference or pytorch only, not tensorrt; use method: lookahead there" in message


# --- lookahead -------------------------------------------------------------------------------


@pytest.mark.parametrize("wng,expected", [((4, 3, 4), 15), ((7, 7, 7), 83), ((1, 1, 0), 0), ((2, 2, 1), 2)])
def test_lookahead_formula(wng, expected):
    assert lookahead_max_draft_len(*wng) == expected


def test_lookahead_plan_derives_draft_len_and_seq_len(plan_of):
    variant = plan_of(PRESET_8B + "build: {max_batch_size: 4, max_seq_len: 2048, max_num_tokens: 32}\n").variants[0]
    assert variant.method == "lookahead" and variant.build.max_draft_len == 15
    assert variant.build.speculative_decoding_mode == "lookahead_decoding"
    assert variant.build.engine_max_seq_len == 2048 + 15
    assert variant.build.engine_max_num_tokens == 4 * (15 + 1)  # raised like trtllm-build does
    clamped = plan_of(
        PRESET_8B + "speculative: {method: none}\n"
        "build: {max_batch_size: 1, max_input_len: 128, max_seq_len: 256, max_num_tokens: 8192}\n"
    )
    assert clamped.variants[0].build.engine_max_num_tokens == 256  # capped at max_batch_size * max_seq_len


def test_lookahead_illegal_wng(problems_of):
    message = problems_of(PRESET_8B + "speculative:\n  lookahead: {window: 2, ngram: 1, verification_set: 0}\n")
    assert "ngram 1 means plain decoding and needs window 1" in message


def test_lookahead_build_serve_mismatch(problems_of, plan_of):
    message = problems_of(PRESET_8B + "speculative:\n  lookahead: {max_draft_len: 16}\n")
    assert "16 does not match (W=4, N=3, G=4), which needs 15" in message
    assert plan_of(PRESET_8B + "speculative:\n  lookahead: {max_draft_len: 15}\n").variants[0].build.max_draft_len == 15


# --- medusa ------------------------------------------------------------------------------------


def test_medusa_head_count_comes_from_weights_not_config(plan_of, tmp_path, hf_config_dir):
    model = hf_config_dir()
    medusa_heads(tmp_path / "heads", num_heads=4, config_heads=2)
    variant = plan_of(
        f"name: m\nmodel: {{path: {model}}}\nheads:\n  medusa: {{path: heads}}\n"
        "speculative:\n  medusa: {choices: chain_4}\n"
    ).variants[0]
    assert variant.speculative.medusa.num_heads == 4
    assert any("config.json says 2 Medusa heads but the weights hold 4" in note for note in variant.notes)


def test_medusa_spec_count_must_match_weights(problems_of, tmp_path, hf_config_dir):
    model = hf_config_dir()
    medusa_heads(tmp_path / "heads", num_heads=3)
    assert "hold 3 heads, not 4" in problems_of(
        f"name: m\nmodel: {{path: {model}}}\nheads:\n  medusa: {{path: heads, num_heads: 4}}\n"
    )


def test_medusa_tree_depth_and_count(problems_of, plan_of):
    base = PRESET_8B + "heads:\n  medusa: {path: nowhere, num_heads: 3}\n"
    assert "tree depth 4 exceeds the 3 Medusa heads" in problems_of(base)  # default mc_sim_7b_63 is depth 4
    message = problems_of(base + "speculative:\n  medusa: {choices: chain_3, max_draft_len: 2}\n")
    assert "3 tree nodes exceed max_draft_len 2" in message
    variant = plan_of(base + "speculative:\n  medusa: {choices: chain_3}\n").variants[0]
    assert variant.build.max_draft_len == 3 and variant.build.speculative_decoding_mode == "medusa"


def test_medusa_vocab_must_divide_tp(problems_of, plan_of, hf_config_dir):
    model = hf_config_dir(vocab_size=1001, num_attention_heads=4, num_key_value_heads=2)
    text = (
        f"name: m\nmodel: {{path: {model}}}\nheads:\n  medusa: {{path: x, num_heads: 3}}\n"
        "speculative:\n  medusa: {choices: chain_3}\nparallel: {tp: 2}\n"
    )
    assert "vocab_size 1001 divisible by tp 2" in problems_of(text)
    assert plan_of(text.replace("tp: 2", "tp: 1")).variants[0].method == "medusa"


def test_fp8_medusa_heads_are_rejected(problems_of):
    text = PRESET_8B + "heads:\n  medusa: {path: x, num_heads: 4}\nquantization: {weights: fp8, quantize_heads: true}\n"
    assert "TensorRT-LLM#2115" in problems_of(text)


# --- eagle -------------------------------------------------------------------------------------

EAGLE_8B = PRESET_8B + "heads:\n  eagle: {path: e}\n"


def test_eagle_depth_must_equal_layers(problems_of, plan_of):
    assert "must equal the eagle_choices tree depth 4 (got 3)" in problems_of(
        EAGLE_8B + "speculative:\n  eagle: {num_eagle_layers: 3}\n"
    )
    variant = plan_of(EAGLE_8B).variants[0]
    assert variant.speculative.eagle.num_eagle_layers == 4
    assert variant.build.engine_max_seq_len == variant.build.max_seq_len + 63 + 4


def test_eagle_non_leaves_per_level(problems_of, plan_of):
    assert "10 non-leaf nodes, more than max_non_leaves_per_layer 9" in problems_of(
        EAGLE_8B + "speculative:\n  eagle: {max_non_leaves_per_layer: 9}\n"
    )
    assert plan_of(EAGLE_8B + "speculative:\n  eagle: {max_non_leaves_per_layer: 10}\n").variants


def test_eagle_needs_pp_1_and_small_batch(problems_of, plan_of):
    assert "does not support pipeline parallelism" in problems_of(EAGLE_8B + "parallel: {pp: 2}\n")
    assert "max_batch_size <= 512" in problems_of(EAGLE_8B + "build: {max_batch_size: 513}\n")
    assert plan_of(EAGLE_8B + "build: {max_batch_size: 512}\n").variants


def test_eagle_max_draft_len_cap(problems_of, plan_of):
    assert "max_draft_len: must be <= 256" in problems_of(EAGLE_8B + "speculative:\n  eagle: {max_draft_len: 300}\n")
    dynamic = plan_of(EAGLE_8B + "speculative:\n  eagle: {dynamic_tree: true, dynamic_tree_max_top_k: 10}\n")
    assert dynamic.variants[0].build.max_draft_len == 256  # 10 + 100 * 3 nodes, capped


def test_non_llama_bases_are_refused_by_the_planner(problems_of, hf_config_dir):
    # The converter takes LlamaForCausalLM only, so the planner refuses the rest up front (EAGLE too).
    model = hf_config_dir(architectures=["MistralForCausalLM"])
    message = problems_of(f"name: m\nmodel: {{path: {model}}}\nheads:\n  eagle: {{path: e}}\n")
    assert "model.path" in message and "unsupported architecture MistralForCausalLM" in message


def test_eagle_missing_fc_bias_is_repaired_with_a_note(plan_of, tmp_path, hf_config_dir):
    model = hf_config_dir()
    eagle_heads(tmp_path / "e", with_bias=False)
    variant = plan_of(f"name: m\nmodel: {{path: {model}}}\nheads:\n  eagle: {{path: e}}\n").variants[0]
    assert any("no fc.bias" in note for note in variant.notes)


def test_eagle_fp8_is_flagged_experimental(plan_of):
    variant = plan_of(EAGLE_8B + "quantization: {weights: fp8}\n").variants[0]
    assert any("experimental" in note for note in variant.notes)


# --- tensor / pipeline parallelism ---------------------------------------------------------------


@pytest.mark.parametrize("tp,ok", [(1, True), (3, True), (2, False), (9, False)])
def test_smollm2_legal_tp(plan_of, problems_of, tp, ok):
    text = f"name: s\nmodel: {{builtin: smollm2-135m-instruct}}\nparallel: {{tp: {tp}}}\ntarget: reference\n"
    if ok:
        assert plan_of(text).variants[0].tp == tp
    else:
        assert "legal tp for this model: [1, 3]" in problems_of(text)


def test_kv_head_replication_when_tp_exceeds_kv_heads(plan_of, problems_of, hf_config_dir):
    model = hf_config_dir(num_attention_heads=8, num_key_value_heads=2, intermediate_size=128)
    assert plan_of(f"name: m\nmodel: {{path: {model}}}\nparallel: {{tp: 4}}\n").variants[0].tp == 4
    model3 = hf_config_dir("m3", num_attention_heads=12, num_key_value_heads=3, intermediate_size=96)
    assert "cannot replicate them" in problems_of(f"name: m\nmodel: {{path: {model3}}}\nparallel: {{tp: 4}}\n")


def test_intermediate_size_must_divide(problems_of, hf_config_dir):
    model = hf_config_dir(intermediate_size=130)
    assert "does not divide intermediate_size 130" in problems_of(
        f"name: m\nmodel: {{path: {model}}}\nparallel: {{tp: 4}}\n"
    )


def test_world_size_against_gpus_and_device_ids(problems_of, plan_of):
    assert "2 GPUs cannot hold world size tp*pp = 4" in problems_of(
        PRESET_8B + "parallel: {tp: 2, pp: 2}\ngpu: {type: h100-sxm-80gb, count: 2}\n"
    )
    assert "lists 1 GPUs; the engine needs tp*pp = 2" in problems_of(
        PRESET_8B + "parallel: {tp: 2}\nserving: {gpu_device_ids: [0]}\n"
    )
    variant = plan_of(PRESET_8B + "parallel: {tp: 2, pp: 2}\ngpu: {type: h100-sxm-80gb, count: 4}\n").variants[0]
    assert variant.world_size == 4


# --- FP8 and memory -------------------------------------------------------------------------------


def test_fp8_needs_ada_or_newer(problems_of, plan_of):
    assert "FP8 needs compute capability >= 8.9" in problems_of(
        PRESET_8B + "quantization: {weights: fp8}\ngpu: {type: a100-80gb}\n"
    )
    variant = plan_of(PRESET_8B + "quantization: {weights: fp8, kv_cache: fp8}\ngpu: {type: l40s}\n").variants[0]
    assert variant.quant.quant_algo == "FP8" and variant.quant.kv_cache_quant_algo == "FP8"
    assert variant.build.use_fp8_context_fmha
    weights_only = plan_of(PRESET_8B + "quantization: {weights: fp8}\ngpu: {type: l40s}\n").variants[0]
    assert not weights_only.build.use_fp8_context_fmha  # trtllm-build ties it to the FP8 KV cache


def test_memory_estimate_rejects_what_cannot_fit(problems_of, plan_of):
    text = "name: big\nmodel: {preset: llama-3.1-70b}\ngpu: {type: h100-sxm-80gb, count: 8}\n"
    message = problems_of(text + "parallel: {tp: 1}\n")
    assert "does not fit on h100-sxm-80gb (80 GiB)" in message and "weights 1" in message
    variant = plan_of(text + "parallel: {tp: 8}\n").variants[0]
    assert variant.memory.fits and 10 < variant.memory.weights_gib < 25


def test_memory_estimate_scales_with_kv_dtype(plan_of):
    bf16 = plan_of(PRESET_8B + "build: {max_batch_size: 64, max_seq_len: 8192, max_input_len: 4096}\n").variants[0]
    fp8 = plan_of(
        PRESET_8B + "build: {max_batch_size: 64, max_seq_len: 8192, max_input_len: 4096}\n"
        "quantization: {weights: fp8, kv_cache: fp8}\n"
    ).variants[0]
    assert fp8.memory.kv_cache_gib == pytest.approx(bf16.memory.kv_cache_gib / 2)
    # 8B: 32 layers * 8 KV heads * 128 dims * 2 (K, V) * 2 bytes = 128 KiB per token.
    assert bf16.memory.kv_cache_gib == pytest.approx(64 * (8192 + 15) * 128 * 1024 / 1024**3)


def test_build_limits(problems_of):
    assert "leaves no room to generate" in problems_of(PRESET_8B + "build: {max_input_len: 2048, max_seq_len: 2048}\n")


def test_missing_weights_without_preset(problems_of, tmp_path):
    assert "add model.preset to plan without weights" in problems_of(f"name: m\nmodel: {{path: {tmp_path}/none}}\n")


def test_stage_layout_and_prequantized_input_skips_quantize(plan_of, hf_config_dir, tmp_path):
    variant = plan_of(PRESET_8B + "quantization: {weights: fp8}\n").variants[0]
    assert [s.name for s in variant.stages] == ["quantize", "convert", "build", "package"]
    assert variant.stage("package").output == tmp_path / "triton_repo" / "p"
    model = hf_config_dir("fp8model")
    (model / "hf_quant_config.json").write_text(
        json.dumps({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}})
    )
    variant = plan_of(f"name: q\nmodel: {{path: {model}}}\n").variants[0]
    assert [s.name for s in variant.stages] == ["convert", "build", "package"]
    assert variant.quant.weights_fp8 and variant.quant.prequantized


def test_llama3_rope_scaling_is_carried_into_the_plan(plan_of):
    arch = plan_of(PRESET_8B).variants[0].arch
    assert arch.rope_theta == 500000.0 and arch.rope_scaling["rope_type"] == "llama3"
    assert arch.rope_scaling["factor"] == 8.0
