"""The predicted engine config.json: hand-checked numbers, the reference build writes exactly it,
and check_engine_config catches an engine that disagrees with the plan."""

from __future__ import annotations

import copy
import json

import pytest
from trtllm_helpers import PRESET_8B, checkpoint_config, write_checkpoint

from pipeline.methods.lookahead import lookahead_max_draft_len
from pipeline.stages import build
from pipeline.stages.runner import run_stage
from pipeline.trtllm.engine_config import check_engine_config, predict_engine_config


@pytest.mark.parametrize(
    "wng,expected", [((7, 7, 7), 83), ((4, 3, 4), 15), ((5, 3, 5), 19), ((7, 5, 7), 55), ((1, 1, 0), 0)]
)
def test_lookahead_draft_len_formula(wng, expected):
    assert lookahead_max_draft_len(*wng) == expected


def test_lookahead_numbers_by_hand(plan_text, tmp_path):
    text = PRESET_8B + (
        "speculative:\n  lookahead: {window: 7, ngram: 7, verification_set: 7}\n"
        "build: {max_batch_size: 16, max_input_len: 1024, max_seq_len: 2048, max_num_tokens: 64}\n"
    )
    variant = plan_text(text)[0]
    config = predict_engine_config(variant, checkpoint_config(variant), output_dir=tmp_path / "engine")
    b = config["build_config"]
    assert config["version"] == "1.2.1"
    assert b["max_draft_len"] == 83 and b["speculative_decoding_mode"] == 8
    assert b["max_seq_len"] == 2048 + 83 == 2131
    assert b["max_num_tokens"] == 16 * (83 + 1) == 1344  # raised from the requested 64
    assert b["max_batch_size"] == 16 and b["max_input_len"] == 1024 and b["max_beam_width"] == 1
    assert b["kv_cache_type"] == "PAGED" and b["gather_context_logits"] is False
    assert b["output_timing_cache"] == str(tmp_path / "engine" / "model.cache")
    p = b["plugin_config"]
    assert p["gpt_attention_plugin"] == "auto" and p["gemm_plugin"] == "auto" and p["paged_kv_cache"] is True
    assert p["remove_input_padding"] is True and p["use_paged_context_fmha"] is True
    assert p["use_fp8_context_fmha"] is False and p["tokens_per_block"] == 32 and p["context_fmha"] is True
    assert p["nccl_plugin"] is None and p["lora_plugin"] is None and p["multiple_profiles"] is True
    assert p["paged_state"] is False and p["dtype"] == "bfloat16"
    assert b["lora_config"]["max_lora_rank"] == 64
    assert config["pretrained_config"]["mapping"] == {"world_size": 1, "tp_size": 1, "pp_size": 1}


def test_eagle_numbers_by_hand(plan_text, tmp_path):
    text = PRESET_8B + (
        "heads:\n  eagle: {path: e}\nparallel: {tp: 2}\n"
        "build: {max_batch_size: 8, max_input_len: 1024, max_seq_len: 2048, max_num_tokens: 256}\n"
    )
    variant = plan_text(text)[0]
    config = predict_engine_config(variant, checkpoint_config(variant), output_dir=tmp_path)
    b = config["build_config"]
    assert b["max_draft_len"] == 63 and b["speculative_decoding_mode"] == 32
    assert b["max_seq_len"] == 2048 + 63 + 4 == 2115  # EAGLE also adds num_eagle_layers
    assert b["max_num_tokens"] == 8 * 64 == 512
    assert b["plugin_config"]["nccl_plugin"] == "bfloat16"  # world size 2
    assert config["pretrained_config"]["num_eagle_layers"] == 4
    assert config["pretrained_config"]["architecture"] == "EagleForCausalLM"


def test_medusa_and_plain_modes(plan_text, tmp_path):
    medusa = plan_text(
        PRESET_8B + "heads:\n  medusa: {path: m, num_heads: 3}\nspeculative:\n  medusa: {choices: chain_3}\n"
    )[0]
    b = predict_engine_config(medusa, checkpoint_config(medusa), output_dir=tmp_path)["build_config"]
    assert (b["speculative_decoding_mode"], b["max_draft_len"], b["max_seq_len"]) == (4, 3, 2048 + 3)
    plain = plan_text(PRESET_8B + "speculative: {method: none}\n")[0]
    b = predict_engine_config(plain, checkpoint_config(plain), output_dir=tmp_path)["build_config"]
    assert (b["speculative_decoding_mode"], b["max_draft_len"], b["max_seq_len"]) == (1, 0, 2048)


def test_extra_flags_land_in_the_predicted_config(plan_text, tmp_path):
    variant = plan_text(
        PRESET_8B + "build:\n  extra_flags: {use_fused_mlp: disable, strip_plan: true, "
        "logits_dtype: float16, max_lora_rank: 8, lora_plugin: disable}\n"
    )[0]
    config = predict_engine_config(variant, checkpoint_config(variant), output_dir=tmp_path)
    assert config["build_config"]["plugin_config"]["use_fused_mlp"] is False
    assert config["build_config"]["use_strip_plan"] is True
    assert config["build_config"]["lora_config"]["max_lora_rank"] == 8
    assert config["pretrained_config"]["logits_dtype"] == "float16"


def test_reference_build_writes_the_prediction_field_by_field(plan_text, tmp_path):
    for text in (PRESET_8B, PRESET_8B + "heads:\n  eagle: {path: e}\n", PRESET_8B + "parallel: {tp: 2, pp: 2}\n"):
        variant = plan_text(text + "target: reference\n")[0]
        checkpoint = write_checkpoint(variant)
        stage = variant.stage("build")
        run_stage(stage, lambda out, variant=variant, stage=stage: build.run(variant, stage, out), on_wait=print)
        written = json.loads((stage.output / "config.json").read_text())
        predicted = predict_engine_config(
            variant, json.loads((checkpoint / "config.json").read_text()), output_dir=stage.output
        )
        for section in ("pretrained_config", "build_config"):
            for key, value in predicted[section].items():
                assert written[section][key] == value, f"{section}.{key}"
        assert written == predicted
        assert sorted(p.name for p in stage.output.glob("rank*")) == [
            f"rank{r}.safetensors" for r in range(variant.world_size)
        ]


# --- check_engine_config: what a real build is verified against --------------------------------


@pytest.fixture
def good(plan_text, tmp_path):
    variant = plan_text(
        PRESET_8B + "heads:\n  medusa: {path: m, num_heads: 4}\nparallel: {tp: 2}\n"
        "gpu: {type: h100-sxm-80gb, count: 2}\n"
    )[0]
    return variant, predict_engine_config(variant, checkpoint_config(variant), output_dir=tmp_path)


@pytest.mark.parametrize(
    "path,value,message",
    [
        ("build_config.max_draft_len", 0, "build_config.max_draft_len is 0, the plan needs 63"),
        ("build_config.speculative_decoding_mode", 1, "speculative_decoding_mode is 1, the plan needs 4 (MEDUSA)"),
        ("build_config.max_seq_len", 2048, "build_config.max_seq_len is 2048, the plan needs 2111"),
        ("build_config.max_num_tokens", 8191, "max_num_tokens is 8191"),
        ("build_config.kv_cache_type", "CONTINUOUS", "kv_cache_type is 'CONTINUOUS'"),
        ("build_config.plugin_config.use_paged_context_fmha", False, "use_paged_context_fmha is False"),
        ("build_config.plugin_config.tokens_per_block", 64, "tokens_per_block is 64, the plan needs 32"),
        ("pretrained_config.mapping.tp_size", 1, "mapping.tp_size is 1, the plan needs 2"),
        ("pretrained_config.mapping.world_size", 4, "world_size is 4, the plan needs tp*pp = 2"),
        ("pretrained_config.num_medusa_heads", 3, "num_medusa_heads is 3, the plan needs 4"),
        ("pretrained_config.architecture", "LlamaForCausalLM", "architecture is 'LlamaForCausalLM'"),
        ("pretrained_config.rotary_scaling", {"type": "llama3"}, "rotary_scaling.factor is None, the model's is 8.0"),
        ("version", "1.3.0", "engines must come from TensorRT-LLM 1.2.x"),
    ],
)
def test_check_engine_config_catches_each_disagreement(good, path, value, message):
    variant, config = good
    assert check_engine_config(config, variant) == []
    broken = copy.deepcopy(config)
    *parents, leaf = path.split(".")
    node = broken
    for part in parents:
        node = node[part]
    node[leaf] = value
    assert any(message in problem for problem in check_engine_config(broken, variant))


def test_mode_given_as_enum_name_is_understood(good):
    variant, config = good
    config["build_config"]["speculative_decoding_mode"] = "SpeculativeDecodingMode.MEDUSA"
    assert check_engine_config(config, variant) == []


def test_rank_files_one_per_rank(good, tmp_path):
    variant, config = good
    folder = tmp_path / "engine"
    folder.mkdir()
    (folder / "rank0.engine").write_bytes(b"x")
    assert check_engine_config(config, variant, engine_dir=folder) == [f"{folder}: missing rank1.engine"]
    (folder / "rank1.engine").write_bytes(b"x")
    assert check_engine_config(config, variant, engine_dir=folder) == []
    (folder / "rank2.engine").write_bytes(b"x")
    assert check_engine_config(config, variant, engine_dir=folder) == [
        f"{folder}: rank2.engine beyond world size 2 (tp*pp)"
    ]
